"""The OpenAI-compatible HTTP server: app factory and routes.

    app = build_app(AsyncLLMEngine.from_engine_args(args), served_model_names=["m"])
    uvicorn.run(app, host="127.0.0.1", port=8000)

``jaxinfer serve MODEL`` builds the same app from vLLM's flags.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from ... import __version__
from ...engine.async_engine import AsyncLLMEngine
from .errors import error_response, install_error_handlers
from .protocol import (ChatCompletionRequest, CompletionRequest,
                       DetokenizeRequest, DetokenizeResponse, ErrorResponse,
                       ModelCard, ModelList, TokenizeChatRequest,
                       TokenizeCompletionRequest, TokenizeResponse)
from .serving_chat import OpenAIServingChat, load_chat_template
from .serving_completion import OpenAIServingCompletion
from .serving_engine import engine_lifespan

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 500, 503)}


def build_app(engine: AsyncLLMEngine, served_model_names: list[str] | None = None,
              api_key: str | None = None, chat_template: str | None = None,
              owns_engine: bool = True) -> FastAPI:
    """The server over a running (or startable) engine. With ``owns_engine``
    the app stops the engine loop when it shuts down."""
    names = list(served_model_names or [str(engine.engine.args.model)])
    template = load_chat_template(chat_template)
    completion = OpenAIServingCompletion(engine, names)
    chat = OpenAIServingChat(engine, names, template)

    app = FastAPI(title="jaxinfer OpenAI-compatible server", version=__version__,
                  lifespan=engine_lifespan(engine, owns_engine))
    app.state.engine = engine
    install_error_handlers(app)

    if api_key:
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def check_api_key(request: Request, call_next):
            if request.url.path.startswith("/v1"):
                got = request.headers.get("Authorization", "").encode()
                if not hmac.compare_digest(got, expected):
                    return error_response("Unauthorized: a valid API key is "
                                          "needed (Authorization: Bearer ...)", 401)
            return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_running:
            return error_response("the engine loop is not running", 500)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=_ERRORS)
    async def models() -> ModelList:
        root = str(engine.engine.args.model)
        return ModelList(data=[ModelCard(id=n, root=root,
                                         max_model_len=engine.max_model_len)
                               for n in names])

    @app.post("/v1/completions", responses=_ERRORS)
    async def create_completion(req: CompletionRequest, raw_request: Request):
        return await completion.create_completion(req, raw_request)

    @app.post("/v1/chat/completions", responses=_ERRORS)
    async def create_chat_completion(req: ChatCompletionRequest,
                                     raw_request: Request):
        return await chat.create_chat_completion(req, raw_request)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(req: TokenizeChatRequest | TokenizeCompletionRequest):
        completion.check_model(req.model)
        if isinstance(req, TokenizeChatRequest):
            _, ids = chat.render(req.messages, req.add_generation_prompt,
                                 req.continue_final_message,
                                 req.chat_template_kwargs)
        else:
            ids = list(completion.tokenizer.encode(
                req.prompt, add_special_tokens=req.add_special_tokens))
        return TokenizeResponse(count=len(ids), max_model_len=engine.max_model_len,
                                tokens=ids)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(req: DetokenizeRequest):
        completion.check_model(req.model)
        completion._check_ids("tokens", req.tokens)
        return DetokenizeResponse(prompt=completion.tokenizer.decode(req.tokens))

    return app


def serve(engine_args, *, host: str = "127.0.0.1", port: int = 8000,
          served_model_names: list[str] | None = None, api_key: str | None = None,
          chat_template: str | None = None, max_num_waiting: int | None = None,
          log_level: str = "info") -> None:
    """Loads the engine and serves until interrupted (`jaxinfer serve`)."""
    import uvicorn
    from ...metrics import EngineMetrics
    names = served_model_names or [engine_args.model]
    engine = AsyncLLMEngine.from_engine_args(
        engine_args, max_num_waiting=max_num_waiting,
        metrics=EngineMetrics(names[0]))
    if engine_args.warmup:  # compiled before the port opens
        print(f"warm-up: {engine.engine.warmup_programs} programs compiled in "
              f"{engine.engine.warmup_seconds:.1f} s", flush=True)
    app = build_app(engine, names, api_key=api_key, chat_template=chat_template)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def main(argv=None) -> int:
    """``python -m jaxinfer.entrypoints.openai.api_server --model M``: the
    same server and flags as ``jaxinfer serve M`` (vLLM's spelling)."""
    import argparse

    from ..cli import run_and_report
    from .cli_args import add_serve_args, run_serve
    parser = argparse.ArgumentParser(
        prog="python -m jaxinfer.entrypoints.openai.api_server",
        description="the OpenAI-compatible server (same as `jaxinfer serve`)")
    add_serve_args(parser)
    return run_and_report(run_serve, parser.parse_args(argv))


if __name__ == "__main__":
    import sys
    sys.exit(main())
