"""What every tool-call format shares: a parser turns the text generated so
far into the content before the calls and the calls seen so far
(``parse``); ``extract`` reads a finished output whole, and
``ToolCallStream`` turns successive parses into OpenAI's streaming deltas
(a call's id, type and name first, then its arguments in pieces)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import ClassVar

from .json_scan import JSONScanError, ScannedObject, scan_object


@dataclasses.dataclass
class PartialCall:
    name: str | None  # None until the name's string has closed
    arguments: str  # the arguments' JSON text so far
    complete: bool  # the call's object has closed


@dataclasses.dataclass
class Parsed:
    content: str  # text before the first call, held back while it may start one
    calls: list[PartialCall]
    broken: bool = False  # the text after a call marker is not a call


@dataclasses.dataclass
class FunctionCall:
    id: str
    name: str
    arguments: str  # a JSON object's text


@dataclasses.dataclass
class ToolCallDelta:
    index: int
    id: str | None = None  # with the name, in a call's first delta
    name: str | None = None
    arguments: str = ""


def held_back(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could begin ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def call_of(obj: ScannedObject, text: str, start: int,
            argument_keys: tuple[str, ...] = ("arguments", "parameters")
            ) -> PartialCall:
    """A call from a scanned ``{"name": ..., "arguments": {...}}`` object
    (arguments sent as a JSON string are decoded once complete)."""
    name = None
    field = obj.fields.get("name")
    if field is not None and field.complete and field.raw.startswith('"'):
        name = json.loads(field.raw)
    arguments = ""
    for key in argument_keys:
        field = obj.fields.get(key)
        if field is None:
            continue
        if field.raw.startswith('"'):
            arguments = json.loads(field.raw) if field.complete else ""
        else:
            arguments = field.raw
        break
    else:
        if obj.end is not None:  # a function without parameters
            arguments = "{}"
    complete = obj.end is not None
    if complete:  # the whole object must be JSON, not only bracket-balanced
        try:
            json.loads(text[start:obj.end])
        except ValueError:
            raise JSONScanError("a tool call is not a JSON object") from None
    return PartialCall(name, arguments, complete)


def scan_call(text: str, i: int, argument_keys=("arguments", "parameters")
              ) -> tuple[PartialCall, int | None]:
    """The call whose object starts at ``text[i]`` and the index past it."""
    obj = scan_object(text, i)
    return call_of(obj, text, i, argument_keys), obj.end


class ToolParser:
    """One model family's tool-call format (``--tool-call-parser``)."""
    name: ClassVar[str] = ""
    # Its markers are special tokens: the output must keep them.
    keeps_special_tokens: ClassVar[bool] = True

    def parse(self, text: str, final: bool) -> Parsed:
        raise NotImplementedError

    def new_id(self) -> str:
        return f"chatcmpl-tool-{uuid.uuid4().hex}"


def extract(parser: ToolParser, text: str) -> tuple[str | None, list[FunctionCall]]:
    """A finished output: (content or None, calls). An output whose calls
    do not parse whole is all content, with no calls."""
    try:
        parsed = parser.parse(text, final=True)
    except JSONScanError:
        return text, []
    calls = []
    for c in parsed.calls:
        try:
            arguments = json.loads(c.arguments)
        except ValueError:
            return text, []
        if not c.complete or c.name is None or not isinstance(arguments, dict):
            return text, []
        calls.append(FunctionCall(parser.new_id(), c.name,
                                  json.dumps(arguments, ensure_ascii=False)))
    if parsed.broken or not calls:
        return text, []
    return parsed.content or None, calls


class ToolCallStream:
    """One choice's stream: feed the whole text so far, get what is new."""

    def __init__(self, parser: ToolParser, max_calls: int | None = None):
        self.parser = parser
        self.max_calls = max_calls  # 1 when parallel_tool_calls is false
        self.content_sent = 0
        self.args_sent: list[int] = []  # per call whose name was sent
        self.failed = False  # the text stopped being a call: send nothing more

    @property
    def called(self) -> bool:
        return bool(self.args_sent)

    def update(self, text: str, final: bool = False
               ) -> tuple[str, list[ToolCallDelta]]:
        """(new content, new call deltas) for the text generated so far."""
        if self.failed:
            return "", []
        try:
            parsed = self.parser.parse(text, final)
        except JSONScanError:
            self.failed = True
            return "", []
        content = parsed.content[self.content_sent:]
        self.content_sent = max(self.content_sent, len(parsed.content))
        deltas = []
        for i, call in enumerate(parsed.calls):
            if self.max_calls is not None and i >= self.max_calls:
                break
            if i == len(self.args_sent):
                if call.name is None:
                    break
                deltas.append(ToolCallDelta(i, self.parser.new_id(), call.name))
                self.args_sent.append(0)
            new = call.arguments[self.args_sent[i]:]
            if new:
                if deltas and deltas[-1].index == i and not deltas[-1].arguments:
                    deltas[-1].arguments = new
                else:
                    deltas.append(ToolCallDelta(i, arguments=new))
                self.args_sent[i] = len(call.arguments)
        return content, deltas
