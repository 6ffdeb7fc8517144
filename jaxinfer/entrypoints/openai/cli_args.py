"""`jaxinfer serve MODEL [flags]`: the engine flags (one per ``EngineArgs``
field, ``cli.add_engine_args``), the HTTP server's flags, and every other
`vllm serve` flag, each refused or ignored as ``jaxinfer/compat/`` says.

    jaxinfer serve MODEL --port 8000
    python -m jaxinfer.entrypoints.openai.api_server --model MODEL --port 8000
"""

from __future__ import annotations

import argparse
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
    add_engine_args(p, defaults={"warmup": True})
    p.add_argument("--host", default="127.0.0.1", help=_HOST_HELP)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("JAXINFER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes "
                   "(default: $JAXINFER_API_KEY)")
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
    from ...engine.async_engine import DEFAULT_MAX_NUM_WAITING
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
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical",
                            "trace"])
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
    from ..cli import engine_args_from
    from ...config import check_kv_cache_dtype, check_quantization
    # Named as flags here (EngineArgs names the fields).
    if getattr(ns, "quantization", None) is not None:
        check_quantization("--quantization", ns.quantization)
    check_kv_cache_dtype("--kv-cache-dtype", ns.kv_cache_dtype)
    check_vllm_flags(ns)
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    args = engine_args_from(ns)
    if getattr(ns, "lora_modules", None) and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    return args


def run_serve(ns: argparse.Namespace) -> int:
    from .api_server import serve
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
    return serve(args, host=ns.host, port=ns.port,
                 served_model_names=ns.served_model_name, api_key=ns.api_key,
                 chat_template=ns.chat_template, max_num_waiting=ns.max_num_waiting,
                 max_body_bytes=ns.max_request_body_bytes,
                 grace_period=ns.shutdown_grace_period,
                 log_level=ns.uvicorn_log_level, lora_modules=lora_modules,
                 chat_template_content_format=ns.chat_template_content_format,
                 **{f[2:].replace("-", "_"): getattr(ns, f[2:].replace("-", "_"))
                    for f in _APP_SWITCHES})
