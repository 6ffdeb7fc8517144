"""Llama 3.x JSON calls: the whole output is ``{"name": ...,
"parameters": {...}}`` objects separated by ``;``, optionally after
``<|python_tag|>``; an output that starts otherwise is content."""

from __future__ import annotations

from .base import Parsed, PartialCall, ToolParser, scan_call
from .json_scan import skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def parse(self, text: str, final: bool) -> Parsed:
        i = skip_ws(text, 0)
        if text.startswith(PYTHON_TAG, i):
            i = skip_ws(text, i + len(PYTHON_TAG))
        elif i == len(text) or PYTHON_TAG.startswith(text[i:]):
            # Nothing yet tells content from a call.
            return Parsed(text if final else "", [])
        if i < len(text) and text[i] != "{":
            return Parsed(text, [])
        calls: list[PartialCall] = []
        broken = False
        while i < len(text):
            call, end = scan_call(text, i, ("parameters", "arguments"))
            calls.append(call)
            if end is None:
                break
            i = skip_ws(text, end)
            if i < len(text) and text[i] == ";":
                i = skip_ws(text, i + 1)
            if i < len(text) and text[i] != "{":
                broken = True
                break
        return Parsed("", calls, broken)
