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
    _add(p, "--max-num-waiting", type=int, default=None,
         help="answer 503 while this many requests already wait")
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
    serve(args, host=ns.host, port=ns.port,
          served_model_names=ns.served_model_name, api_key=ns.api_key,
          chat_template=ns.chat_template, max_num_waiting=ns.max_num_waiting,
          log_level=ns.uvicorn_log_level)
    return 0
