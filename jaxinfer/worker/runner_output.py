"""What one step of the runner hands back to the engine (host data)."""

from __future__ import annotations

import dataclasses

from ..logprobs import LogprobRows


@dataclasses.dataclass
class ModelRunnerOutput:
    sampled: dict[str, int]  # request id -> new token, for rows that sample
    # request id -> its sampled token's logprobs (one row), when asked for
    logprobs: dict[str, LogprobRows] = dataclasses.field(default_factory=dict)
    # request id -> (index of the first prompt token scored, its rows)
    prompt_logprobs: dict[str, tuple[int, LogprobRows]] = dataclasses.field(
        default_factory=dict)
