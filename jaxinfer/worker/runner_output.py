"""What one step of the runner hands back to the engine (host data)."""

from __future__ import annotations

import dataclasses

from ..logprobs import LogprobRows


@dataclasses.dataclass
class ModelRunnerOutput:
    # request id -> new token, for rows that sample; after a multi-step
    # decode (SchedulerOutput.num_steps > 1), the list of its tokens
    sampled: dict[str, int | list[int]]
    # request id -> its sampled token's logprobs (one row), when asked for
    logprobs: dict[str, LogprobRows] = dataclasses.field(default_factory=dict)
    # request id -> (index of the first prompt token scored, its rows)
    prompt_logprobs: dict[str, tuple[int, LogprobRows]] = dataclasses.field(
        default_factory=dict)
