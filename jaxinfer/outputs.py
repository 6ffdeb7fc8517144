"""vLLM-shaped results: `RequestOutput` holding `CompletionOutput`s."""

from __future__ import annotations

import dataclasses
from typing import Any

from .logprobs import Logprob, PromptLogprobs, SampleLogprobs  # noqa: F401 - re-exported, as vLLM has them here


@dataclasses.dataclass
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None  # per token: id -> Logprob
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None
    stop_reason: int | str | None = None  # the stop string or token id hit

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None  # [0] is None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


# -- pooling models (jaxinfer/pooling/) ----------------------------------------

@dataclasses.dataclass
class PoolingOutput:
    data: Any  # the pooled vector: np.ndarray [D] float32 (vLLM: a tensor)


@dataclasses.dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool
    metrics: RequestMetrics | None = None


@dataclasses.dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclasses.dataclass
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(out.request_id,
                   EmbeddingOutput([float(x) for x in out.outputs.data]),
                   out.prompt_token_ids, out.finished)


@dataclasses.dataclass
class ScoringOutput:
    score: float  # cosine similarity of the two texts' embeddings


@dataclasses.dataclass
class ScoringRequestOutput:
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]  # both texts' tokens, one after the other
    finished: bool
