"""Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, after optional content. Text after the first block that
is not another block (the whitespace between blocks) is not content."""

from __future__ import annotations

from .base import Parsed, PartialCall, ToolParser, held_back, scan_call
from .json_scan import skip_ws

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def parse(self, text: str, final: bool) -> Parsed:
        first = text.find(START)
        if first < 0:
            keep = 0 if final else held_back(text, START)
            return Parsed(text[:len(text) - keep], [])
        calls: list[PartialCall] = []
        i: int | None = first
        broken = False
        while i is not None and i >= 0:
            j = skip_ws(text, i + len(START))
            if j == len(text):
                break
            if text[j] != "{":
                broken = True
                break
            call, end = scan_call(text, j)
            calls.append(call)
            if end is None:
                break
            k = skip_ws(text, end)
            if text.startswith(END, k):
                k += len(END)
            i = text.find(START, k)
        return Parsed(text[:first], calls, broken)
