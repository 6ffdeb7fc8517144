"""The request-body side of the compatibility tables: before a body is
parsed, every field vLLM knows but jaxinfer does not implement is refused
(naming the feature) or ignored (logged), and a field nobody knows is
refused naming it. The request models call this from a ``before``
validator, so the client gets a 400 in OpenAI's shape."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import UnsupportedFeatureError
from .request_fields import CONTENT_PART_FEATURES, request_field_status
from .surface import vllm_surface


class UnknownFieldError(ValueError):
    """A request field neither vLLM nor jaxinfer knows."""


def check_request_body(kind: str, body: Any, own_fields: set[str]) -> None:
    """``kind``: a key of the recorded surface (``completion_request``,
    ``chat_completion_request``, ...); ``own_fields``: the fields of our
    model for that body. Raises UnsupportedFeatureError / UnknownFieldError
    (ValueErrors); returns for anything else, bad types included (the
    model reports those)."""
    if not isinstance(body, dict):
        return
    known = set(vllm_surface()[kind]) | own_fields
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise UnknownFieldError(
            f"unknown field(s) {', '.join(unknown)}: neither vLLM "
            "0.11.0 nor jaxinfer has them (docs/compatibility.md lists every "
            "field)")
    for name, value in body.items():
        entry = request_field_status(kind, name)
        if entry is not None:  # per request: ignored fields log at debug level
            entry.check(name, value, logging.DEBUG)
    options = body.get("stream_options")
    if isinstance(options, dict):
        for name, value in options.items():
            entry = request_field_status("stream_options", name)
            if entry is not None:
                entry.check(f"stream_options.{name}", value)
    messages = body.get("messages")
    # Only a list is walked: any other type (true, 3, a string) is the
    # model's to refuse with a 400, not an iteration to crash on.
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            kind_ = part.get("type") if isinstance(part, dict) else None
            # A type that is not a string (a dict, a list: unhashable) is
            # the model's 400 too.
            if isinstance(kind_, str) and kind_ in CONTENT_PART_FEATURES:
                raise UnsupportedFeatureError(
                    f"messages[].content[].type={kind_!r}",
                    CONTENT_PART_FEATURES[kind_], "send text content only")
