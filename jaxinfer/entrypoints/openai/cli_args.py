"""`jaxinfer serve MODEL [flags]`: the engine flags (one per ``EngineArgs``
field, ``cli.add_engine_args``), the HTTP server's flags, and every other
`vllm serve` flag, each refused or ignored as ``jaxinfer/compat/`` says.

    jaxinfer serve MODEL --port 8000
    python -m jaxinfer.entrypoints.openai.api_server --model MODEL --port 8000
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from ...errors import UnsupportedQuantizationError  # noqa: F401 (re-exported)

_HOST_HELP = ("address to bind; default 127.0.0.1 (this machine only), "
              "where vLLM binds every interface: pass --host 0.0.0.0 to "
              "serve other machines (and set --api-key)")


def add_serve_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every flag of `jaxinfer serve` on ``p``."""
    from ...compat.surface import add_vllm_flags
    from ..cli import add_engine_args
    p.add_argument("model_tag", nargs="?", default=None,
                   help="the model (same as --model)")
    # A server compiles before its port opens: no request waits for it.
    # usage_context: "server" unless given (serve_engine_args).
    add_engine_args(p, defaults={"warmup": True, "usage_context": None})
    p.add_argument("--host", default="127.0.0.1", help=_HOST_HELP)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("JAXINFER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route "
                   "but /health and /metrics (default: $JAXINFER_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) the API accepts; the first is reported")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one")
    p.add_argument("--chat-template-content-format", default="auto",
                   choices=["auto", "string", "openai"],
                   help="how message content reaches the template: a string "
                   "(images as placeholders before the text) or OpenAI's list "
                   "of parts; auto: the list if the template loops over it")
    p.add_argument("--lora-modules", nargs="+", default=None,
                   metavar="NAME=PATH",
                   help="LoRA adapters served under their names (needs "
                   "--enable-lora): name=path, or a JSON object with name, "
                   "path and base_model_name")
    from ...engine.request_stream import DEFAULT_MAX_NUM_WAITING
    p.add_argument("--api-server-count", "-asc", type=int, default=None,
                   help="HTTP front-end processes (tokenizing, streaming) "
                   "beside the one engine-core process (default: one per "
                   "four CPU cores, from 1 to 4)")
    p.add_argument("--single-process", action="store_true",
                   help="serve HTTP from the engine's own process (no "
                   "separate engine core; --api-server-count must be 1)")
    from ..http_guards import DEFAULT_MAX_BODY_BYTES
    from ..server_runner import DEFAULT_GRACE_PERIOD_S
    p.add_argument("--max-num-waiting", type=int, default=DEFAULT_MAX_NUM_WAITING,
                   help="answer 503 (with Retry-After) while this many "
                   "requests already wait; 0 refuses any wait (default: "
                   "%(default)s)")
    p.add_argument("--max-request-body-bytes", type=int,
                   default=DEFAULT_MAX_BODY_BYTES,
                   help="answer 413 to a larger request body (default: "
                   "%(default)s)")
    p.add_argument("--shutdown-grace-period", type=float,
                   default=DEFAULT_GRACE_PERIOD_S,
                   help="seconds that requests in flight may take to finish "
                   "after SIGTERM before they are failed (default: %(default)s)")
    from ..connections import add_connection_flags
    add_connection_flags(p)
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical",
                            "trace"])
    p.add_argument("--enable-auto-tool-choice",
                   action=argparse.BooleanOptionalAction, default=False,
                   help="let the model decide to call tools (tool_choice "
                   "'auto'); needs --tool-call-parser")
    from .tool_parsers import TOOL_PARSERS
    p.add_argument("--tool-call-parser", default=None,
                   choices=sorted(TOOL_PARSERS),
                   help="the model's tool-call format, read for tool_choice "
                   "'auto' ('required' and named functions work without it)")
    p.add_argument("--exclude-tools-when-tool-choice-none",
                   action=argparse.BooleanOptionalAction, default=False,
                   help="do not show the tools to the chat template when "
                   "tool_choice is 'none'")
    for flag, help_ in _APP_SWITCHES.items():
        p.add_argument(flag, action=argparse.BooleanOptionalAction,
                       default=False, help=help_)
    add_vllm_flags(p)
    return p


# vLLM's switches of the HTTP app, passed to build_app under their dest.
_APP_SWITCHES = {
    "--return-tokens-as-token-ids": "show logprob tokens as 'token_id:{id}' "
    "(a request's return_tokens_as_token_ids overrides it)",
    "--enable-tokenizer-info-endpoint": "serve /tokenizer_info (it shows the "
    "tokenizer's configuration and chat template)",
    "--enable-server-load-tracking": "count requests in flight, read at /load",
    "--api-key-protect-metrics": "put /metrics behind --api-key too (only "
    "/health stays open)",
}


def add_serve_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible "
                       "HTTP API (bound to 127.0.0.1 unless --host says "
                       "otherwise)")
    add_serve_args(p)
    p.set_defaults(func=run_serve)
    return p


def serve_engine_args(ns: argparse.Namespace):
    """The EngineArgs of a parsed serve command line; a vLLM flag jaxinfer
    refuses raises UnsupportedFeatureError naming it."""
    from ...compat.surface import check_vllm_flags
    from ...config import check_kv_cache_dtype, check_quantization
    from ..cli import engine_args_from
    # Named as flags here (EngineArgs names the fields).
    if getattr(ns, "quantization", None) is not None:
        check_quantization("--quantization", ns.quantization)
    check_kv_cache_dtype("--kv-cache-dtype", ns.kv_cache_dtype)
    from ...structured.params import OTHER_VLLM_BACKENDS, check_backend
    backend = getattr(ns, "guided_decoding_backend", None)
    if backend is not None and backend.split(":")[0] in OTHER_VLLM_BACKENDS:
        check_backend("--guided-decoding-backend", backend)
    check_vllm_flags(ns)
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    explicit_context = ns.usage_context is not None
    if not explicit_context:
        ns.usage_context = "server"
    args = engine_args_from(ns)
    if not explicit_context and args.parallel_config().multi_process:
        # Its other processes may be started by LLM(...) as well as by
        # serve: every process takes the offline defaults, so that all
        # derive the same batch sizes.
        args = dataclasses.replace(args, usage_context="llm")
    if getattr(ns, "lora_modules", None) and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    return args


def run_serve(ns: argparse.Namespace) -> int:
    from .serving_models import parse_lora_modules
    args = serve_engine_args(ns)
    lora_modules = parse_lora_modules(ns.lora_modules)
    if ns.max_num_waiting is not None and ns.max_num_waiting < 0:
        raise ValueError(f"--max-num-waiting must be >= 0, got {ns.max_num_waiting}")
    if ns.max_request_body_bytes < 1:
        raise ValueError(f"--max-request-body-bytes must be >= 1, got "
                         f"{ns.max_request_body_bytes}")
    if ns.shutdown_grace_period < 0:
        raise ValueError(f"--shutdown-grace-period must be >= 0, got "
                         f"{ns.shutdown_grace_period}")
    from ..connections import limits_from
    from .serving_tools import ToolConfig
    tool_config = ToolConfig(
        ns.enable_auto_tool_choice, ns.tool_call_parser,
        ns.exclude_tools_when_tool_choice_none)
    options = dict(
        host=ns.host, port=ns.port, limits=limits_from(ns),
        tool_config=tool_config, served_model_names=ns.served_model_name,
        api_key=ns.api_key, chat_template=ns.chat_template,
        max_num_waiting=ns.max_num_waiting,
        max_body_bytes=ns.max_request_body_bytes,
        grace_period=ns.shutdown_grace_period, log_level=ns.uvicorn_log_level,
        lora_modules=lora_modules,
        chat_template_content_format=ns.chat_template_content_format,
        **{f[2:].replace("-", "_"): getattr(ns, f[2:].replace("-", "_"))
           for f in _APP_SWITCHES})
    count = ns.api_server_count
    if count is not None and count < 1:
        raise ValueError(f"--api-server-count must be >= 1, got {count}")
    if ns.single_process or args.parallel_config().multi_process:
        # A multi-process engine's process 0 serves from its own process
        # (its JAX processes are brought up together).
        if count not in (None, 1):
            raise ValueError(
                f"--api-server-count {count} needs the engine "
                "core in a process of its own: drop --single-process (a "
                "multi-process engine, --num-processes, serves from one "
                "process: give --api-server-count 1)")
        from .api_server import serve
        return serve(args, **options)
    from .serve_processes import default_api_server_count, serve_processes
    return serve_processes(args, api_server_count=count or
                           default_api_server_count(), **options)
