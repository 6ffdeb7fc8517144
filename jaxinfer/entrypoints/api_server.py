"""vLLM's simple demo server: ``POST /generate`` with a prompt and sampling
fields, optionally streamed; plus ``/health``. For anything real use the
OpenAI-compatible server (``jaxinfer serve``).

    python -m jaxinfer.entrypoints.api_server --model M --port 8000
    curl localhost:8000/generate -d '{"prompt": "Hi", "max_tokens": 8}'
    -> {"text": ["Hi<completion>"]}   (prompt + output, one per sample)

Streaming (``"stream": true``) sends one JSON object per line, each holding
the full text so far.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine.async_engine import AsyncLLMEngine, EngineDeadError, QueueFullError
from ..sampling_params import SamplingParams
from .openai.serving_engine import cancel_on_disconnect, engine_lifespan


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build_app(engine: AsyncLLMEngine, owns_engine: bool = True) -> FastAPI:
    app = FastAPI(title="jaxinfer simple API server", lifespan=engine_lifespan(engine, owns_engine))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running else 500)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("the body must be a JSON object", 400)
        if not isinstance(body, dict) or "prompt" not in body:
            return _error("the body must be a JSON object with a 'prompt'", 400)
        prompt = body.pop("prompt")
        stream = bool(body.pop("stream", False))
        try:
            params = SamplingParams.from_optional(**body)
            gen = engine.iterate(await engine.add_request(
                f"gen-{uuid.uuid4().hex}", prompt, params))
        except (ValueError, TypeError) as e:
            return _error(str(e), 400)
        except QueueFullError as e:
            return _error(str(e), 503)
        except EngineDeadError as e:
            return _error(str(e), 500)
        prefix = prompt if isinstance(prompt, str) else ""
        texts = [""] * params.n

        if stream:
            async def lines():
                async for out in gen:
                    for c in out.outputs:
                        texts[c.index] += c.text
                    yield json.dumps({"text": [prefix + t for t in texts]}) + "\n"
            return StreamingResponse(lines(), media_type="application/x-ndjson")

        try:
            async with cancel_on_disconnect(request):
                async for out in gen:
                    for c in out.outputs:
                        texts[c.index] += c.text
        except asyncio.CancelledError:
            return Response(status_code=499)
        return JSONResponse({"text": [prefix + t for t in texts]})

    return app


def main(argv=None) -> None:
    import uvicorn
    from .cli import add_engine_args, engine_args_from
    parser = argparse.ArgumentParser(prog="python -m jaxinfer.entrypoints.api_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    add_engine_args(parser)
    ns = parser.parse_args(argv)
    engine = AsyncLLMEngine.from_engine_args(engine_args_from(ns))
    uvicorn.run(build_app(engine), host=ns.host, port=ns.port)


if __name__ == "__main__":
    main()
