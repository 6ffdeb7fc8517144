"""vLLM's simple demo server: ``POST /generate`` with a prompt and sampling
fields, optionally streamed; plus ``/health``. For anything real use the
OpenAI-compatible server (``jaxinfer serve``).

    python -m jaxinfer.entrypoints.api_server --model M --port 8000
    curl localhost:8000/generate -d '{"prompt": "Hi", "max_tokens": 8}'
    -> {"text": ["Hi<completion>"]}   (prompt + output, one per sample)

Streaming (``"stream": true``) sends one JSON object per line, each holding
the full text so far. Errors are ``{"error": message}`` with the status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Mapping
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.async_engine import DEFAULT_MAX_NUM_WAITING, AsyncLLMEngine
from ..engine.input_processor import check_context_length
from ..errors import ServingError, http_status
from ..sampling_params import SamplingParams
from .http_guards import DEFAULT_MAX_BODY_BYTES, RequestGuard
from .json_body import JSONBodyRoute
from .openai.errors import error_headers
from .openai.protocol import FLOAT32_MAX, INT32_MAX, INT64_MAX, INT64_MIN, RequestModel, TokenId
from .openai.serving_engine import cancel_on_disconnect, engine_lifespan
from .server_runner import DEFAULT_GRACE_PERIOD_S, run_server

TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class TokensPrompt(RequestModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    prompt_token_ids: TokenIds
    prompt: str | None = None


class TextPrompt(RequestModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    prompt: str


Float = Annotated[float, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]


class GenerateRequest(RequestModel):
    """The body of /generate: a prompt and SamplingParams' fields, typed
    strictly; an unknown field is refused by name."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    prompt: str | TokenIds | TokensPrompt | TextPrompt
    stream: bool = False
    n: int | None = Field(None, ge=1, le=INT32_MAX)
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    repetition_penalty: Float | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: Float | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    ignore_eos: bool | None = None
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    logit_bias: dict[str, Float] | None = None
    allowed_token_ids: list[TokenId] | None = None

    def engine_prompt(self):
        if isinstance(self.prompt, (TokensPrompt, TextPrompt)):
            return self.prompt.model_dump(exclude_none=True)
        return self.prompt

    def sampling_params(self) -> SamplingParams:
        fields = self.model_dump(exclude={"prompt", "stream"}, exclude_none=True)
        return SamplingParams.from_optional(**fields)


def _error(message: str, status: int,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status,
                        headers={**error_headers(status), **(headers or {})})


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def build_app(engine: AsyncLLMEngine, owns_engine: bool = True,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="jaxinfer simple API server",
                  lifespan=engine_lifespan(engine, owns_engine))
    app.router.route_class = JSONBodyRoute  # depth and encoding limits
    app.add_middleware(RequestGuard, engine=engine, max_body_bytes=max_body_bytes,
                       generation_paths=frozenset({"/generate"}), respond=_error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return _error(_validation_message(exc), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return _error(str(exc.detail), exc.status_code, exc.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception):
        return _error(f"internal server error: {exc!r}", http_status(exc))

    @app.get("/health", response_class=Response,
             responses={200: {"description": "The engine loop runs (empty body)."}})
    async def health() -> Response:
        problem = engine.health()
        if problem is not None:
            return _error(problem, 500)
        return Response(status_code=200 if engine.accepting else 503)

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request) -> Response:
        try:
            params = req.sampling_params()
            processed = await engine.run_blocking(
                engine.input_processor.process, req.engine_prompt(), params)
            check_context_length(len(processed.prompt_token_ids),
                                 req.max_tokens, engine.max_model_len)
            gen = engine.iterate(await engine.add_request(
                f"gen-{uuid.uuid4().hex}", processed))
        except (ValueError, ServingError) as e:
            return _error(str(e), http_status(e))
        prefix = processed.prompt or ""
        texts = [""] * params.n

        if req.stream:
            async def lines():
                try:
                    async for out in gen:
                        for c in out.outputs:
                            texts[c.index] += c.text
                        yield json.dumps({"text": [prefix + t for t in texts]}) + "\n"
                except Exception as e:  # noqa: BLE001 - the client must hear why
                    yield json.dumps({"error": str(e), "code": http_status(e)}) + "\n"
            return StreamingResponse(lines(), media_type="application/x-ndjson")

        try:
            async with cancel_on_disconnect(request):
                async for out in gen:
                    for c in out.outputs:
                        texts[c.index] += c.text
        except asyncio.CancelledError:
            return Response(status_code=499)
        except (ValueError, ServingError) as e:
            return _error(str(e), http_status(e))
        return JSONResponse({"text": [prefix + t for t in texts]})

    return app


def main(argv=None) -> int:
    from .cli import add_engine_args, engine_args_from
    from .connections import add_connection_flags, limits_from
    parser = argparse.ArgumentParser(prog="python -m jaxinfer.entrypoints.api_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-num-waiting", type=int, default=DEFAULT_MAX_NUM_WAITING)
    parser.add_argument("--max-request-body-bytes", type=int,
                        default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--shutdown-grace-period", type=float,
                        default=DEFAULT_GRACE_PERIOD_S)
    add_connection_flags(parser)
    add_engine_args(parser)
    ns = parser.parse_args(argv)
    limits = limits_from(ns)
    engine = AsyncLLMEngine.from_engine_args(engine_args_from(ns),
                                             max_num_waiting=ns.max_num_waiting)
    app = build_app(engine, max_body_bytes=ns.max_request_body_bytes)
    return run_server(app, engine, host=ns.host, port=ns.port,
                      grace_period=ns.shutdown_grace_period, limits=limits)


if __name__ == "__main__":
    raise SystemExit(main())
