"""Pydantic models of the OpenAI API (the subset vLLM serves), with vLLM's
extra sampling fields. Bounds that protect the engine (ids that land in int32
arrays, seeds) are declared here so they show in the OpenAPI schema.

Requests are validated strictly: a float, string or bool where an integer
belongs is refused, not converted, and text must be valid Unicode (no lone
surrogates). Bounds that depend on the served model (vocabulary size,
max_model_len, max_num_seqs, max_logprobs) carry an ``x-limit`` mark that the
app replaces with the real value in its OpenAPI schema (`model_limits`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import JsonDict

from . import model_limits
from .tool_protocol import (
    ChatCompletionTool,
    DeltaToolCall,
    NamedToolChoice,
    ToolCall,
    ToolCallMessage,
)

# The limit marks as json_schema_extra's JsonDict (their dict[str, str] is
# one, but mypy holds dict invariant in its value type).
limit = cast(Callable[[str], JsonDict], model_limits.limit)

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
INT32_MAX = 2 ** 31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # larger would be inf in the sampler


# A token id; the schema states the served vocabulary's bound.
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX, json_schema_extra=limit("token_id"))]
NonEmptyStr = Annotated[str, Field(min_length=1)]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    # Unknown fields are ignored (clients send newer fields); NaN and
    # infinities are rejected (400) instead of reaching the sampler.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StrictModel(OpenAIBaseModel):
    """What clients send: no type coercion ("5", 5.0 and true are not 5)."""
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


def find_invalid_text(value: Any, path: str = "body") -> str | None:
    """The path of the first string (or key) in decoded JSON that is not
    valid Unicode (a lone surrogate, which JSON's \\u escapes allow)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return where
        elif isinstance(item, dict):
            for k, v in item.items():
                # The path goes into the error message: escape what cannot
                # be encoded (the offending key itself, say).
                name = str(k).encode("utf-8", "backslashreplace").decode()
                stack.append((k, f"{where}.{name} (a key)"))
                stack.append((v, f"{where}.{name}"))
        elif isinstance(item, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(item))
    return None


class RequestModel(StrictModel):
    """A request body: strict types, and valid Unicode everywhere. Before
    parsing, vLLM's fields that jaxinfer lacks are refused naming the feature
    (or ignored, logged) and unknown fields are refused by name
    (``jaxinfer/compat/``), for the bodies that name their ``surface_kind``."""
    surface_kind: ClassVar[str] = ""  # the recorded vLLM body this model is

    @model_validator(mode="before")
    @classmethod
    def _vllm_surface(cls, data: Any) -> Any:
        if cls.surface_kind:
            from ...compat.request_check import check_request_body
            check_request_body(cls.surface_kind, data, set(cls.model_fields))
        return data

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = find_invalid_text(data, "")
        if where is not None:
            raise ValueError(f"{where.lstrip('.') or 'the body'} is not valid "
                             "Unicode (it holds a lone surrogate); send UTF-8 text")
        return data


# -- errors --------------------------------------------------------------------

class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


# -- shared --------------------------------------------------------------------

class StreamOptions(StrictModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class JsonSchemaFormat(StrictModel):
    """OpenAI's ``response_format.json_schema``."""
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # "schema" shadows a BaseModel attribute: read through the alias.
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format json_schema needs its "
                             "json_schema object (name, schema)")
        return self


class SamplingFields(RequestModel):
    """Fields both completion endpoints share (OpenAI's, then vLLM's).
    Before parsing, vLLM's fields that jaxinfer lacks are refused naming the
    feature (or ignored, logged), and unknown fields are refused by name
    (``jaxinfer/compat/``)."""
    @model_validator(mode="after")
    def _stream_only_fields(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be given when stream "
                             "is true")
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs are not available when stream "
                             "is true")
        if self.stream and self.use_beam_search:
            raise ValueError("use_beam_search does not stream: set stream "
                             "to false")
        if self.stream and (self.best_of or self.n) > self.n:
            raise ValueError("best_of above n does not stream (every sample "
                             "must finish before the best are known): set "
                             "stream to false")
        return self

    model: str | None = None
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=INT32_MAX, json_schema_extra=limit("max_num_seqs"))
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=FLOAT32_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = None
    # vLLM extensions
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX,
                              json_schema_extra=limit("vocab_size"))
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=FLOAT32_MAX)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    best_of: int | None = Field(None, ge=1, le=INT32_MAX,
                                json_schema_extra=limit("max_num_seqs"))
    use_beam_search: bool = False
    length_penalty: float = Field(1.0, ge=-FLOAT32_MAX, le=FLOAT32_MAX)
    truncate_prompt_tokens: int | None = Field(
        None, ge=1, le=INT32_MAX, json_schema_extra=limit("max_model_len"))
    # -1: the whole vocabulary (then bounded by --max-logprobs), as vLLM
    prompt_logprobs: int | None = Field(None, ge=-1, le=INT32_MAX,
                                        json_schema_extra=limit("max_logprobs"))
    priority: int = Field(0, ge=INT64_MIN, le=INT64_MAX)  # lower runs first
    request_id: str | None = Field(None, min_length=1, max_length=256)
    return_tokens_as_token_ids: bool | None = None  # "token_id:{id}" strings
    return_token_ids: bool | None = None  # token ids beside the text
    echo: bool = False
    # Structured outputs (one source at most: serving_structured.py)
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None


# -- completions ---------------------------------------------------------------

class CompletionRequest(SamplingFields):
    prompt: (NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1)]
             | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                         Field(min_length=1)])
    max_tokens: int | None = Field(16, ge=1, le=INT32_MAX,
                                   json_schema_extra=limit("max_tokens"))
    logprobs: int | None = Field(None, ge=-1, le=INT32_MAX,
                                 json_schema_extra=limit("max_logprobs"))
    suffix: str | None = None
    add_special_tokens: bool = True
    surface_kind: ClassVar[str] = "completion_request"


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    """One candidate at a prompt position (vLLM's Logprob)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per prompt token: {token id: candidate}; None for the first token.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids
    token_ids: list[int] | None = None  # with return_token_ids


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


# -- chat ----------------------------------------------------------------------

class ChatContentPart(StrictModel):
    type: Literal["text"]
    text: str


class ImageURL(StrictModel):
    # A base64 data URL, or a file:// URL under --allowed-local-media-path
    # (remote URLs are refused: jaxinfer/multimodal/media.py).
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None  # OpenAI's; one resolution here


class ChatImagePart(StrictModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[ChatContentPart | ChatImagePart,
                        Field(discriminator="type")]


class ChatMessage(StrictModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallMessage] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message's answer to one




class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX,
                                   json_schema_extra=limit("max_tokens"))
    max_completion_tokens: int | None = Field(
        None, ge=1, le=INT32_MAX, json_schema_extra=limit("max_tokens"))
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=-1, le=INT32_MAX,
                                     json_schema_extra=limit("max_logprobs"))
    tools: list[ChatCompletionTool] | None = None
    # None: "auto" with tools, "none" without (serving_tools.py)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # vLLM extensions
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False  # the template adds its own
    surface_kind: ClassVar[str] = "chat_completion_request"


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(OpenAIBaseModel):
    content: list[ChatLogprob] | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


# -- models, tokenizer ---------------------------------------------------------

class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "jaxinfer"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeCompletionRequest(RequestModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False
    surface_kind: ClassVar[str] = "tokenize_completion"


class TokenizeChatRequest(RequestModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False  # the template adds its own
    return_token_strs: bool | None = False
    tools: list[ChatCompletionTool] | None = None  # given to the template
    surface_kind: ClassVar[str] = "tokenize_chat"


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # with return_token_strs


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[TokenId]
    surface_kind: ClassVar[str] = "detokenize"


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


class LoadLoRAAdapterRequest(StrictModel):
    """``POST /v1/load_lora_adapter`` (vLLM's body)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str | None = None
    lora_path: str | None = None


class UnloadLoRAAdapterRequest(StrictModel):
    """``POST /v1/unload_lora_adapter`` (vLLM's body)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str | None = None
    lora_int_id: int | None = None
