"""The outputs of ``tool_choice`` "required" and a named function, which
the grammar forces whatever the model's own format: "required" generates
a JSON list of ``{"name": ..., "parameters": {...}}`` (``required_schema``),
a named function its arguments object alone (``named_schema``)."""

from __future__ import annotations

from typing import Any

from .base import Parsed, PartialCall, ToolParser
from .json_scan import JSONScanError, skip_ws, value_end
from .mistral import scan_list

# A function without parameters takes an empty object.
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {},
                                    "additionalProperties": False}


def required_schema(functions: list[dict[str, Any]],
                    parallel: bool) -> dict[str, Any]:
    """One or more calls (one if not ``parallel``), each naming one of
    ``functions`` (OpenAI function objects) with arguments that follow its
    parameters schema."""
    options = [{"type": "object", "properties": {
        "name": {"type": "string", "enum": [f["name"]]},
        "parameters": f.get("parameters") or EMPTY_PARAMETERS},
        "required": ["name", "parameters"], "additionalProperties": False}
        for f in functions]
    schema: dict[str, Any] = {
        "type": "array", "minItems": 1,
        "items": options[0] if len(options) == 1 else {"anyOf": options}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def named_schema(function: dict[str, Any]) -> dict[str, Any]:
    return function.get("parameters") or EMPTY_PARAMETERS


class RequiredToolParser(ToolParser):
    name = "required"
    keeps_special_tokens = False

    def parse(self, text: str, final: bool) -> Parsed:
        i = skip_ws(text, 0)
        calls: list[PartialCall] = []
        if i == len(text):
            return Parsed("", calls)
        if text[i] != "[":
            raise JSONScanError("the output is not a list of calls")
        broken = scan_list(text, i, calls, ("parameters",))
        return Parsed("", calls, broken)


class NamedToolParser(ToolParser):
    keeps_special_tokens = False

    def __init__(self, function_name: str):
        self.function_name = function_name

    def parse(self, text: str, final: bool) -> Parsed:
        i = skip_ws(text, 0)
        if i == len(text):
            return Parsed("", [PartialCall(self.function_name, "", False)])
        end = value_end(text, i)
        return Parsed("", [PartialCall(self.function_name,
                                       text[i:end], end is not None)])
