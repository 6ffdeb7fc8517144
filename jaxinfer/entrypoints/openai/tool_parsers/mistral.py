"""Mistral: ``[TOOL_CALLS]`` and then a JSON list of ``{"name": ...,
"arguments": {...}}`` objects, or (newer tokenizers) ``name[ARGS]{...}``
per call, each after its own ``[TOOL_CALLS]``. Call ids are nine letters
and digits, as Mistral's templates require."""

from __future__ import annotations

import random
import string

from .base import Parsed, PartialCall, ToolParser, held_back, scan_call
from .json_scan import JSONScanError, skip_ws

START, ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID_CHARS = string.ascii_letters + string.digits


def scan_list(text: str, i: int, calls: list[PartialCall],
              argument_keys=("arguments", "parameters")) -> bool:
    """Appends the calls of the JSON list at ``text[i]`` (``[``); True if
    the text after it is not a call list."""
    i = skip_ws(text, i + 1)
    while i < len(text):
        if text[i] == "]":
            return bool(text[skip_ws(text, i + 1):])
        if text[i] != "{":
            raise JSONScanError("a tool call list holds something other "
                                "than objects")
        call, end = scan_call(text, i, argument_keys)
        calls.append(call)
        if end is None:
            return False
        i = skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = skip_ws(text, i + 1)
    return False


class MistralToolParser(ToolParser):
    name = "mistral"

    def new_id(self) -> str:
        return "".join(random.choices(_ID_CHARS, k=9))

    def parse(self, text: str, final: bool) -> Parsed:
        first = text.find(START)
        if first < 0:
            keep = 0 if final else held_back(text, START)
            return Parsed(text[:len(text) - keep], [])
        calls: list[PartialCall] = []
        i = skip_ws(text, first + len(START))
        if i < len(text) and text[i] == "[":
            broken = scan_list(text, i, calls)
            return Parsed(text[:first], calls, broken)
        broken = False
        while 0 <= i < len(text):  # name[ARGS]{...}, repeated
            sep = text.find(ARGS, i)
            if sep < 0:
                if final:
                    broken = True
                break
            name = text[i:sep].strip()
            j = skip_ws(text, sep + len(ARGS))
            if j == len(text):
                calls.append(PartialCall(name, "", False))
                break
            if text[j] != "{":
                broken = True
                break
            call, end = scan_call(text, j)
            # The object is the arguments themselves here.
            arguments = text[j:end] if end is not None else text[j:]
            calls.append(PartialCall(name, arguments, end is not None))
            if end is None:
                break
            k = skip_ws(text, end)
            i = (skip_ws(text, k + len(START)) if text.startswith(START, k)
                 else len(text) if k == len(text) else -1)
            if i < 0:
                broken = True
        return Parsed(text[:first], calls, broken)
