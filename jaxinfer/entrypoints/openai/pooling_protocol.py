"""The pooling endpoints' bodies: OpenAI's /v1/embeddings, and vLLM's
/pooling and /score (its field names and defaults)."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import Field

from .protocol import INT32_MAX, OpenAIBaseModel, RequestModel, TokenId, UsageInfo, random_id

# OpenAI's input forms: a string, a list of strings, one list of token ids,
# or a list of them.
EmbeddingInput = (str | list[str] | list[TokenId] | list[list[TokenId]])
Dimensions = Annotated[int, Field(ge=1, le=INT32_MAX)]
Truncate = Annotated[int, Field(ge=-1, le=INT32_MAX)]


class PoolingFields(RequestModel):
    """What every pooling body shares (vLLM's extras beside OpenAI's)."""
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Truncate | None = None  # -1: the whole context
    add_special_tokens: bool = True
    priority: int = 0
    normalize: bool | None = None  # None: the model's default


class EmbeddingRequest(PoolingFields):
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None


class PoolingRequest(EmbeddingRequest):
    """vLLM's /pooling: the raw pooled vector's body is /v1/embeddings'."""


class ScoreRequest(PoolingFields):
    text_1: str | list[str]
    text_2: str | list[str]


class EmbeddingData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str  # str: base64 of little-endian float32


class PoolingData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: list[float] | str


class ScoreData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class _ListResponse(OpenAIBaseModel):
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: UsageInfo


class EmbeddingResponse(_ListResponse):
    id: str = Field(default_factory=lambda: random_id("embd"))
    data: list[EmbeddingData]


class PoolingResponse(_ListResponse):
    id: str = Field(default_factory=lambda: random_id("pool"))
    data: list[PoolingData]


class ScoreResponse(_ListResponse):
    id: str = Field(default_factory=lambda: random_id("score"))
    data: list[ScoreData]
