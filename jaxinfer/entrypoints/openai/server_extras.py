"""vLLM's smaller server routes' helpers: /tokenizer_info's description,
/load's in-flight counter, and reading /invocations' JSON body."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from ..json_body import parse_json_body
from .errors import APIError


def tokenizer_description(tokenizer, chat_template: str | None) -> dict[str, Any]:
    """What vLLM's /tokenizer_info reports: the tokenizer's init config
    (JSON-safe values), its class and the chat template in use."""
    info: dict[str, Any] = {}
    for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items():
        try:
            json.dumps(value)
        except TypeError:
            value = str(value)
        info[key] = value
    info["tokenizer_class"] = type(tokenizer).__name__
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        info.setdefault(name, getattr(tokenizer, name, None))
    info["chat_template"] = chat_template or getattr(tokenizer, "chat_template", None)
    info["model_max_length"] = getattr(tokenizer, "model_max_length", None)
    return info


class LoadCounter:
    """Requests on the generation routes not yet answered in full (streams
    count until their last byte)."""

    def __init__(self):
        self.value = 0


def install_load_tracking(app, paths: frozenset[str]) -> LoadCounter:
    """An ASGI middleware counting in-flight requests on ``paths`` (vLLM's
    --enable-server-load-tracking, read at /load)."""
    load = LoadCounter()

    class TrackLoad:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http" or scope["path"] not in paths:
                return await self.inner(scope, receive, send)
            load.value += 1
            try:
                await self.inner(scope, receive, send)
            finally:
                load.value -= 1

    app.add_middleware(TrackLoad)
    return load


async def read_json_body(request: Request) -> Any:
    """The body through the server's one JSON reader (json_body.py)."""
    try:
        return parse_json_body(await request.body())
    except json.JSONDecodeError as e:
        raise APIError(f"the body is not valid JSON ({e.msg} at character "
                       f"{e.pos})", param=None) from None
