"""What one step of the runner hands back to the engine (host data)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..logprobs import LogprobRows


@dataclasses.dataclass
class ModelRunnerOutput:
    # request id -> new token, for rows that sample (one-step decodes)
    sampled: dict[str, int]
    # request id -> its sampled token's logprobs (one row), when asked for
    logprobs: dict[str, LogprobRows] = dataclasses.field(default_factory=dict)
    # request id -> (index of the first prompt token scored, its rows)
    prompt_logprobs: dict[str, tuple[int, LogprobRows]] = dataclasses.field(
        default_factory=dict)
    # request id -> its tokens in order, for rows that sample, after a
    # multi-step decode (SchedulerOutput.num_steps > 1); `sampled` is empty
    window: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # Speculative steps: request id -> its accepted drafts then one target
    # token, in order, for rows that sample; `sampled` is empty. Logprob
    # rows (in `logprobs`) then hold one row per token.
    verified: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # request id -> its raw pooled vector [D] float32, for prompts whose
    # last chunk ran (pooling engines; `sampled` is empty)
    pooled: dict[str, Any] = dataclasses.field(default_factory=dict)
