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
    preempted_ids: list[str]  # requests preempted this step (pages freed or swapped)
    finished_ids: list[str]  # requests finished since the last step (pages freed)
    # Copies the runner makes before the step, in this order:
    blocks_to_swap_out: list[tuple[int, int]]  # (device_page, host_slot): device -> host
    blocks_to_swap_in: list[tuple[int, int]]  # (device_page, host_slot): host -> device

    @classmethod
    def make_empty(cls) -> "SchedulerOutput":
        return cls([], 0, [], [], [], [])

    @property
    def has_copies(self) -> bool:
        return bool(self.blocks_to_swap_out or self.blocks_to_swap_in)

    @property
    def is_empty(self) -> bool:
        """Nothing for the runner to do (no tokens and no page copies)."""
        return not self.scheduled and not self.has_copies
