"""`jaxinfer serve MODEL [flags]`: vLLM's serve flags on top of the engine
flags that `cli.add_engine_args` defines."""

from __future__ import annotations

import argparse
import dataclasses
import os


class UnsupportedQuantizationError(ValueError):
    """--quantization names a method this engine does not implement."""


def _add(p: argparse.ArgumentParser, *names, **kwargs) -> None:
    """Adds a flag unless the engine flags already define it."""
    if not any(n in p._option_string_actions for n in names):
        p.add_argument(*names, **kwargs)


def add_serve_parser(sub) -> argparse.ArgumentParser:
    from ..cli import add_engine_args
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible "
                       "HTTP API")
    p.add_argument("model_tag", nargs="?", default=None,
                   help="the model (same as --model)")
    add_engine_args(p)
    _add(p, "--host", default="127.0.0.1")
    _add(p, "--port", type=int, default=8000)
    _add(p, "--api-key", default=os.environ.get("JAXINFER_API_KEY"),
         help="require 'Authorization: Bearer KEY' on /v1 routes "
              "(default: $JAXINFER_API_KEY)")
    _add(p, "--served-model-name", nargs="+", default=None,
         help="model name(s) the API accepts; the first is reported")
    _add(p, "--chat-template", default=None,
         help="a Jinja chat template, or a file holding one")
    _add(p, "--max-logprobs", type=int, default=20)
    _add(p, "--quantization", "-q", default=None)
    from ...engine.async_engine import DEFAULT_MAX_NUM_WAITING
    from ..http_guards import DEFAULT_MAX_BODY_BYTES
    from ..server_runner import DEFAULT_GRACE_PERIOD_S
    _add(p, "--max-num-waiting", type=int, default=DEFAULT_MAX_NUM_WAITING,
         help="answer 503 (with Retry-After) while this many requests "
              "already wait; 0 refuses any wait (default: %(default)s)")
    _add(p, "--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
         help="answer 413 to a larger request body (default: %(default)s)")
    _add(p, "--shutdown-grace-period", type=float, default=DEFAULT_GRACE_PERIOD_S,
         help="seconds that requests in flight may take to finish after "
              "SIGTERM before they are failed (default: %(default)s)")
    _add(p, "--uvicorn-log-level", default="info",
         choices=["debug", "info", "warning", "error", "critical"])
    p.set_defaults(func=run_serve)
    return p


def serve_engine_args(ns: argparse.Namespace):
    from ...config import EngineArgs
    from ..cli import engine_args_from
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    args = engine_args_from(ns)
    extra = {"max_logprobs": ns.max_logprobs}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    if ns.quantization is not None:
        if "quantization" not in fields:
            raise UnsupportedQuantizationError(
                f"--quantization {ns.quantization!r} is not supported yet: "
                "leave --quantization unset")
        extra["quantization"] = ns.quantization
    return dataclasses.replace(args, **{k: v for k, v in extra.items()
                                        if k in fields})


def run_serve(ns: argparse.Namespace) -> int:
    from .api_server import serve
    args = serve_engine_args(ns)
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
                 log_level=ns.uvicorn_log_level)
