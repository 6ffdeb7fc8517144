"""tool_choice rules without a model: defaults, the flags "auto" needs,
the grammar "required" and named functions get, and the 400s."""

from __future__ import annotations

import jsonschema
import pytest

from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import ChatCompletionRequest
from jaxinfer.entrypoints.openai.serving_tools import ToolConfig, plan_tools

F = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}},
    "required": ["x"]}}}
G = {"type": "function", "function": {"name": "g"}}
HERMES = ToolConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")


def plan(config=HERMES, **body):
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **body})
    return plan_tools(req, config)


def test_default_choice_is_auto_with_tools_none_without():
    assert plan(tools=[F]).choice == "auto"
    assert plan().choice == "none" and plan().template_tools is None


def test_auto_needs_both_flags():
    with pytest.raises(APIError, match="--enable-auto-tool-choice and "
                       "--tool-call-parser"):
        plan(ToolConfig(), tools=[F])
    with pytest.raises(ValueError, match="needs --tool-call-parser"):
        ToolConfig(enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="hermes"):
        ToolConfig(tool_call_parser="nonesuch")


def test_required_and_named_work_without_flags_through_the_grammar():
    p = plan(ToolConfig(), tools=[F, G], tool_choice="required")
    schema = p.structured.json
    jsonschema.validate([{"name": "f", "parameters": {"x": 1}},
                         {"name": "g", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "f", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    one = plan(ToolConfig(), tools=[F, G], tool_choice="required",
               parallel_tool_calls=False).structured.json
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "g", "parameters": {}}] * 2, one)
    named = plan(ToolConfig(), tools=[F, G], tool_choice={
        "type": "function", "function": {"name": "f"}})
    assert named.structured.json == F["function"]["parameters"]
    assert named.max_calls == 1


def test_none_may_hide_the_tools_from_the_template():
    assert plan(tools=[F], tool_choice="none").template_tools
    hidden = ToolConfig(exclude_tools_when_tool_choice_none=True)
    assert plan(hidden, tools=[F], tool_choice="none").template_tools is None


def test_required_with_an_empty_list_is_none():
    assert plan(tools=[], tool_choice="required").choice == "none"


@pytest.mark.parametrize("body, match", [
    ({"tool_choice": "auto"}, "needs tools"),
    ({"tools": [F], "tool_choice": {"type": "function",
                                    "function": {"name": "h"}}}, "not in tools"),
    ({"tools": [F, F]}, "more than once"),
])
def test_refusals_name_the_fix(body, match):
    with pytest.raises(APIError, match=match):
        plan(**body)
