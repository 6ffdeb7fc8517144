"""Pydantic models of OpenAI's function tools: the ``tools`` a request
offers, a named ``tool_choice``, the ``tool_calls`` of assistant messages
(sent back in a conversation and answered) and their streaming deltas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)
_PLAIN = ConfigDict(extra="ignore", allow_inf_nan=False)


class FunctionDefinition(BaseModel):
    model_config = _STRICT
    name: str = Field(min_length=1)
    description: str | None = None
    # A JSON schema; "required" and named tool_choice enforce it through the
    # grammar, "auto" parses what the model writes without constraining it.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionTool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = _STRICT
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionName


class FunctionCallMessage(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str  # a JSON object's text


class ToolCallMessage(BaseModel):
    """A call in an assistant message the client sends back."""
    model_config = _STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallMessage


class FunctionCallOut(BaseModel):
    model_config = _PLAIN
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = _PLAIN
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class DeltaFunctionCall(BaseModel):
    model_config = _PLAIN
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    model_config = _PLAIN
    index: int
    id: str | None = None  # with type and name, in a call's first delta
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None
