"""What the scheduler decided for one step: plain data for the runner."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ScheduledRequest:
    request_id: str
    token_ids: list[int]  # tokens whose K/V this step computes, in order
    start_pos: int  # position of token_ids[0]; equals the tokens already in pages
    block_table: list[int]  # page ids covering positions [0, start_pos + len(token_ids))
    sample: bool  # True when this chunk ends at the request's last known token


@dataclasses.dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]  # in the order the runner lays out rows
    num_scheduled_tokens: int  # sum of len(token_ids); <= max_num_batched_tokens
    preempted_ids: list[str]  # requests preempted this step (pages freed)
    finished_ids: list[str]  # requests finished since the last step (pages freed)

    @classmethod
    def make_empty(cls) -> "SchedulerOutput":
        return cls([], 0, [], [])

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
