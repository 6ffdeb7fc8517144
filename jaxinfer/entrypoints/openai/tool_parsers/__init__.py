"""Tool-call parsers: the text a model generates -> OpenAI ``tool_calls``,
whole (``extract``) or as streaming deltas (``ToolCallStream``). The
server picks one by ``--tool-call-parser`` for ``tool_choice`` "auto";
"required" and named functions use ``forced.py`` (the grammar fixes the
format)."""

from __future__ import annotations

from .base import FunctionCall, ToolCallDelta, ToolCallStream, ToolParser, extract
from .forced import NamedToolParser, RequiredToolParser, named_schema, required_schema
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser

# --tool-call-parser names (vLLM's), each to its format.
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}


def tool_parser(name: str) -> ToolParser:
    """The parser named by ``--tool-call-parser``; ValueError naming the
    choices for another name."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} is not available; "
                         f"choose one of {', '.join(sorted(TOOL_PARSERS))}")
    return TOOL_PARSERS[name]()


__all__ = ["FunctionCall", "NamedToolParser", "RequiredToolParser",
           "TOOL_PARSERS", "ToolCallDelta", "ToolCallStream", "ToolParser",
           "extract", "named_schema", "required_schema", "tool_parser"]
