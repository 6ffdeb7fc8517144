"""Tool calling in ``/v1/chat/completions``: a request's ``tools``,
``tool_choice`` and ``parallel_tool_calls`` -> a ``ToolPlan`` (what the
chat template is given, the grammar that forces calls, the parser that
reads them), with vLLM's rules and 400s:

- ``tool_choice`` defaults to "auto" when tools are given, "none" when not;
  any other choice without tools is refused.
- "auto" needs the server's ``--enable-auto-tool-choice`` and
  ``--tool-call-parser``; the model decides and the parser reads its format.
- "required" and a named function work on any server: the grammar forces a
  JSON list of calls, or the named function's arguments, built from the
  functions' ``parameters`` schemas (``tool_parsers/forced.py``).
- "none" renders the tools (unless ``--exclude-tools-when-tool-choice-none``)
  and reads no calls.
- Forced calls are written as ``json.dumps`` writes JSON (no free
  whitespace): a model cannot pad them with whitespace until max_tokens.
- ``parallel_tool_calls`` false: at most one call (the grammar allows one;
  a parser's further calls are dropped).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ...sampling_params import SamplingParams
from ...structured.params import StructuredOutputsParams
from .errors import APIError
from .tool_parsers import (
    NamedToolParser,
    RequiredToolParser,
    ToolParser,
    named_schema,
    required_schema,
    tool_parser,
)

AUTO_NEEDS_FLAGS = ('"auto" tool choice requires --enable-auto-tool-choice '
                    'and --tool-call-parser to be set')


@dataclasses.dataclass(frozen=True)
class ToolConfig:
    """The server's tool flags (vLLM's)."""
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False

    def __post_init__(self):
        if self.tool_call_parser is not None:
            tool_parser(self.tool_call_parser)  # refuses an unknown name
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs "
                             "--tool-call-parser (hermes, llama3_json, "
                             "llama4_json or mistral)")


@dataclasses.dataclass
class ToolPlan:
    choice: str  # "none", "auto", "required" or "named"
    template_tools: list[dict[str, Any]] | None  # given to the chat template
    parser: ToolParser | None  # reads calls from the output; None: content
    max_calls: int | None  # 1 when parallel_tool_calls is false
    structured: StructuredOutputsParams | None  # the grammar forcing calls


def plan_tools(req, config: ToolConfig) -> ToolPlan:
    """The request's plan; raises APIError (400) naming what to change."""
    tools = req.tools or None
    functions = [t.function.model_dump(exclude_none=True) for t in tools or ()]
    names = [f["name"] for f in functions]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise APIError(f"tools name the function(s) {', '.join(dup)} more "
                       "than once; give each function once", param="tools")
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "required" and req.tools == []:
        choice = "none"  # OpenAI's reading of "required" with no tools
    if choice != "none" and not tools:
        raise APIError("tool_choice other than 'none' needs tools; give the "
                       "functions in tools", param="tool_choice")
    max_calls = None if req.parallel_tool_calls else 1
    template_tools = ([{"type": "function", "function": f} for f in functions]
                      if tools else None)
    if choice == "none":
        if config.exclude_tools_when_tool_choice_none:
            template_tools = None
        return ToolPlan("none", template_tools, None, None, None)
    if choice == "auto":
        if not (config.enable_auto_tool_choice and config.tool_call_parser):
            raise APIError(AUTO_NEEDS_FLAGS + "; or set tool_choice to "
                           "'required', 'none' or a named function",
                           param="tool_choice")
        return ToolPlan("auto", template_tools,
                        tool_parser(config.tool_call_parser), max_calls, None)
    if choice == "required":
        return ToolPlan("required", template_tools, RequiredToolParser(),
                        max_calls, StructuredOutputsParams(
                            json=required_schema(functions, max_calls is None),
                            disable_any_whitespace=True))
    name = choice.function.name
    if name not in names:
        raise APIError(f"tool_choice names the function {name!r}, which is "
                       f"not in tools ({', '.join(names)})", param="tool_choice")
    function = functions[names.index(name)]
    return ToolPlan("named", template_tools, NamedToolParser(name), 1,
                    StructuredOutputsParams(json=named_schema(function),
                                            disable_any_whitespace=True))


def apply_plan(plan: ToolPlan, params: SamplingParams) -> SamplingParams:
    """The request's sampling parameters with the plan's grammar (a second
    constraint is refused) and, for a parser whose markers are special
    tokens, those tokens kept in the text."""
    changes: dict[str, Any] = {}
    if plan.structured is not None:
        if params.structured_outputs is not None:
            raise APIError(f"tool_choice {plan.choice!r} constrains the output "
                           "itself; drop response_format / structured_outputs "
                           "/ guided_* or use tool_choice 'auto'",
                           param="tool_choice")
        changes["structured_outputs"] = plan.structured
    if plan.parser is not None and plan.parser.keeps_special_tokens:
        changes["skip_special_tokens"] = False
    if not changes:
        return params
    try:
        return dataclasses.replace(params, **changes)
    except ValueError as e:
        raise APIError(str(e), param="tool_choice") from None


def template_messages(messages) -> list[dict[str, Any]]:
    """The messages as the chat template reads them: an assistant's
    ``tool_calls`` arguments decoded to objects (HF templates expect
    dicts); a tool message must say which call it answers."""
    out = []
    for i, m in enumerate(messages):
        d = m.model_dump(exclude_none=True)
        if m.role == "tool" and m.tool_call_id is None:
            raise APIError(f"messages[{i}] has role 'tool' but no "
                           "tool_call_id; give the id of the call it answers",
                           param="messages")
        for j, call in enumerate(d.get("tool_calls") or ()):
            text = call["function"]["arguments"]
            try:
                call["function"]["arguments"] = json.loads(text) if text else {}
            except ValueError:
                raise APIError(f"messages[{i}].tool_calls[{j}].function."
                               "arguments is not JSON; send the arguments "
                               "object's JSON text", param="messages") from None
        out.append(d)
    return out
