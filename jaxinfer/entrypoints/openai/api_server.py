"""The OpenAI-compatible HTTP server: app factory and routes.

    app = build_app(AsyncLLMEngine.from_engine_args(args), served_model_names=["m"])
    uvicorn.run(app, host="127.0.0.1", port=8000)

``jaxinfer serve MODEL`` builds the same app from vLLM's flags.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from ... import __version__
from ...engine.engine_client import EngineClient
from ...engine.request_stream import DEFAULT_MAX_NUM_WAITING
from ...fast_tokenizer import hf_tokenizer
from ..connections import ConnectionLimits
from ..http_guards import DEFAULT_MAX_BODY_BYTES, RequestGuard
from ..json_body import JSONBodyRoute
from ..server_runner import DEFAULT_GRACE_PERIOD_S, run_server
from .auth import APIKeyGuard
from .errors import APIError, error_response, install_error_handlers
from .model_limits import apply_limits, model_limits
from .pooling_protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingRequest,
    PoolingResponse,
    ScoreRequest,
    ScoreResponse,
)
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    LoadLoRAAdapterRequest,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    UnloadLoRAAdapterRequest,
)
from .server_extras import install_load_tracking, read_json_body, tokenizer_description
from .serving_chat import OpenAIServingChat, load_chat_template
from .serving_completion import OpenAIServingCompletion
from .serving_engine import engine_lifespan
from .serving_models import LoRAModulePath, ServingModels, runtime_lora_updating_allowed
from .serving_pooling import OpenAIServingPooling
from .serving_tools import ToolConfig

logger = logging.getLogger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}
_GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
# Pooling routes: refused like generation ones when the queue is full.
_POOLING_PATHS = frozenset({"/v1/embeddings", "/pooling", "/score", "/v1/score"})
# The generation routes answer JSON, or with "stream": true an event stream.
_GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {**_ERRORS, 200: {
    "description": "The completion; with stream=true, server-sent events "
                   "(chunks, then `data: [DONE]`).",
    "content": {"application/json": {},
                "text/event-stream": {"schema": {}}}}}  # any event


def build_app(engine: EngineClient, served_model_names: list[str] | None = None,
              api_key: str | None = None, chat_template: str | None = None,
              owns_engine: bool = True,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              return_tokens_as_token_ids: bool = False,
              enable_tokenizer_info_endpoint: bool = False,
              enable_server_load_tracking: bool = False,
              chat_template_content_format: str = "auto",
              lora_modules: list[LoRAModulePath] | None = None,
              api_key_protect_metrics: bool = False,
              tool_config: ToolConfig | None = None,
              lora_modules_loaded: bool = False) -> FastAPI:
    """The server over a running (or startable) engine. With ``owns_engine``
    the app stops the engine loop when it shuts down. The rest are vLLM's
    flags of the same names (``lora_modules``: adapters read now, served
    under their names; ``lora_modules_loaded``: the engine core read them
    already); ``api_key_protect_metrics`` puts /metrics behind the key too
    (auth.py lists what the key protects)."""
    if api_key_protect_metrics and not api_key:
        raise ValueError("--api-key-protect-metrics needs --api-key")
    names = list(served_model_names or [str(engine.model.args.model)])
    template = load_chat_template(chat_template)
    # A server renders chat templates: build transformers' tokenizer now
    # rather than inside the first chat request (fast_tokenizer.py).
    hf_tokenizer(engine.tokenizer)
    models = ServingModels(engine, names)
    models.load_static(lora_modules or [], load=not lora_modules_loaded)
    completion = OpenAIServingCompletion(engine, names, models)
    chat = OpenAIServingChat(engine, names, template, models,
                             chat_template_content_format, tool_config)
    for serving in (completion, chat):
        serving.return_tokens_as_token_ids = return_tokens_as_token_ids
    pooling = OpenAIServingPooling(engine, names, models)

    app = FastAPI(title="jaxinfer OpenAI-compatible server", version=__version__,
                  lifespan=engine_lifespan(engine, owns_engine))
    app.router.route_class = JSONBodyRoute  # one body reader for every route
    app.state.engine = engine
    install_error_handlers(app)

    app.add_middleware(  # outermost: refuses before the body is read
        RequestGuard, engine=engine, max_body_bytes=max_body_bytes,
        generation_paths=_GENERATION_PATHS | _POOLING_PATHS,
        respond=lambda message, status: error_response(message, status))

    @app.get("/health", response_class=Response, responses={
        200: {"description": "The engine loop runs (empty body)."},
        500: {"model": ErrorResponse, "description": "The engine loop died."},
        503: {"model": ErrorResponse, "description": "Shutting down."}})
    async def health() -> Response:
        problem = engine.health()
        if problem is not None:
            return error_response(problem, 500)
        if not engine.accepting:
            return error_response("the server is shutting down", 503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse, responses={
        200: {"description": "Prometheus metrics (text exposition format)."}})
    async def metrics() -> Response:
        return Response(await engine.render_metrics(),
                        media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=_ERRORS)
    async def list_models() -> ModelList:
        await models.refresh()
        return ModelList(data=models.cards(engine.max_model_len))

    if runtime_lora_updating_allowed():
        logger.warning("LoRA adapters may be loaded and unloaded at run time "
                       "(/v1/load_lora_adapter): only for trusted clients")

        @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
                  responses=_ERRORS)
        async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> str:
            return await models.load(req.lora_name, req.lora_path)

        @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
                  responses=_ERRORS)
        async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> str:
            return await models.unload(req.lora_name, req.lora_int_id)

    @app.post("/v1/completions", responses=_GENERATION_RESPONSES)
    async def create_completion(req: CompletionRequest, raw_request: Request):
        return await completion.create_completion(req, raw_request)

    @app.post("/v1/chat/completions", responses=_GENERATION_RESPONSES)
    async def create_chat_completion(req: ChatCompletionRequest,
                                     raw_request: Request):
        return await chat.create_chat_completion(req, raw_request)

    @app.post("/v1/embeddings", response_model=EmbeddingResponse,
              responses=_ERRORS)
    async def create_embedding(req: EmbeddingRequest) -> EmbeddingResponse:
        return await pooling.create_embedding(req)

    @app.post("/pooling", response_model=PoolingResponse, responses=_ERRORS)
    async def create_pooling(req: PoolingRequest) -> PoolingResponse:
        return await pooling.create_pooling(req)

    @app.post("/score", response_model=ScoreResponse, responses=_ERRORS)
    @app.post("/v1/score", response_model=ScoreResponse, responses=_ERRORS)
    async def create_score(req: ScoreRequest) -> ScoreResponse:
        return await pooling.create_score(req)

    @app.post("/invocations", responses=_ERRORS)
    async def invocations(raw_request: Request):
        """SageMaker's single route: a chat body (``messages``) or a
        completion body (``prompt``), answered as the matching endpoint."""
        body = await read_json_body(raw_request)
        model = (ChatCompletionRequest if isinstance(body, dict)
                 and "messages" in body else CompletionRequest)
        try:
            req = model.model_validate(body)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None
        if isinstance(req, ChatCompletionRequest):
            return await chat.create_chat_completion(req, raw_request)
        return await completion.create_completion(req, raw_request)

    if enable_tokenizer_info_endpoint:
        @app.get("/tokenizer_info")
        async def tokenizer_info() -> dict:
            """The tokenizer's configuration (vLLM's
            --enable-tokenizer-info-endpoint; it shows the chat template)."""
            return tokenizer_description(completion.tokenizer, template)

    if enable_server_load_tracking:
        load = install_load_tracking(app, _GENERATION_PATHS | {"/invocations"})

        @app.get("/load")
        async def server_load() -> dict:
            return {"server_load": load.value}

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(req: TokenizeChatRequest | TokenizeCompletionRequest):
        completion.check_model(req.model)
        if isinstance(req, TokenizeChatRequest):
            if req.chat_template is not None:
                raise APIError("a per-request chat_template is not accepted; "
                               "start the server with --chat-template",
                               param="chat_template")
            _, ids, images = await engine.run_blocking(
                chat.render, req.messages, req.add_generation_prompt,
                req.continue_final_message, req.chat_template_kwargs,
                req.add_special_tokens,
                [t.model_dump(exclude_none=True) for t in req.tools or ()] or None)
            if images:  # counted as the engine counts them
                ids = engine.input_processor.images.expand(ids, len(images))[0]
        else:
            ids = await engine.run_blocking(
                engine.input_processor.encode, "prompt", req.prompt,
                req.add_special_tokens)
        strs = (completion.tokenizer.convert_ids_to_tokens(ids)
                if req.return_token_strs else None)
        return TokenizeResponse(count=len(ids), max_model_len=engine.max_model_len,
                                tokens=ids, token_strs=strs)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(req: DetokenizeRequest):
        completion.check_model(req.model)
        completion.check_ids("tokens", req.tokens)
        text = await engine.run_blocking(completion.tokenizer.decode, req.tokens)
        return DetokenizeResponse(prompt=text)

    limits = model_limits(engine)

    def openapi() -> dict:
        """FastAPI's schema with the served model's bounds filled in."""
        if app.openapi_schema is None:
            app.openapi_schema = apply_limits(FastAPI.openapi(app), limits)
        return app.openapi_schema

    # FastAPI documents replacing the method to customise the schema.
    app.openapi = openapi  # type: ignore[method-assign]
    if api_key:  # added last: the outermost layer, before any body is read
        app.add_middleware(APIKeyGuard, api_key=api_key, respond=error_response,
                           protect_metrics=api_key_protect_metrics)
    return app


def serve(engine_args, *, host: str = "127.0.0.1", port: int = 8000,
          served_model_names: list[str] | None = None, api_key: str | None = None,
          chat_template: str | None = None,
          max_num_waiting: int | None = DEFAULT_MAX_NUM_WAITING,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          grace_period: float = DEFAULT_GRACE_PERIOD_S,
          log_level: str = "info", engine: EngineClient | None = None,
          limits: ConnectionLimits | None = None, **app_options) -> int:
    """Loads the engine in this process (unless given) and serves until
    SIGTERM or engine death; returns the exit status. `jaxinfer serve` runs
    the engine core in a process of its own (`serve_processes.py`) unless
    --single-process asks for this single process."""
    from ...engine.async_engine import AsyncLLMEngine
    from ...metrics import EngineMetrics
    names = served_model_names or [engine_args.model]
    if engine is None:
        from ...distributed.launch import is_worker, run_worker
        if is_worker(engine_args):  # --process-id N > 0: process 0 serves
            run_worker(engine_args)
            return 0
        engine = AsyncLLMEngine.from_engine_args(
            engine_args, max_num_waiting=max_num_waiting,
            metrics=EngineMetrics(names[0]))
    where = engine.describe()
    if where is not None:  # where a multi-process engine's workers run
        print(where, flush=True)
    if isinstance(engine, AsyncLLMEngine) and engine.engine.warmup_programs:
        print(f"warm-up: {engine.engine.warmup_programs} programs compiled in "
              f"{engine.engine.warmup_seconds:.1f} s", flush=True)
    app = build_app(engine, names, api_key=api_key, chat_template=chat_template,
                    max_body_bytes=max_body_bytes, **app_options)
    return run_server(app, engine, host=host, port=port,
                      grace_period=grace_period, log_level=log_level,
                      limits=limits)


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
