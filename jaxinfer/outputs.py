"""vLLM-shaped results: `RequestOutput` holding `CompletionOutput`s."""

from __future__ import annotations

import dataclasses

from .logprobs import Logprob, PromptLogprobs, SampleLogprobs  # noqa: F401


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
