"""What the scheduler decided for one step: plain data for the runner, and
the whole of what the runner learns about requests (as vLLM V1's
NewRequestData / CachedRequestData): a request entering the running batch
(new, or resumed after preemption) is sent whole once; each step then sends
only what changed for the rows it runs."""

from __future__ import annotations

import dataclasses

from ..lora.request import LoRARequest
from ..sampling_params import SamplingParams


@dataclasses.dataclass
class NewRequestData:
    """A request joining the running batch, as the runner must know it."""
    request_id: str
    token_ids: list[int]  # prompt + outputs known at admission
    num_prompt_tokens: int
    sampling_params: SamplingParams
    # Keyword-only: both are optional and of unrelated types, so a positional
    # LoRARequest must not land silently in mm_inputs.
    # images (MultiModalInput) over their placeholders
    mm_inputs: tuple = dataclasses.field(default=(), kw_only=True)
    # its LoRA adapter; None: the base model
    lora_request: LoRARequest | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass
class ScheduledRequest:
    request_id: str
    # tokens whose K/V this step computes, in order (PENDING_TOKEN: on the device)
    token_ids: list[int]
    start_pos: int  # position of token_ids[0]; equals the tokens already in pages
    block_table: list[int]  # page ids covering positions [0, start_pos + len(token_ids))
    sample: bool  # True when this chunk ends at the request's last known token
    sample_index: int = 0  # which output token the row samples (0 = first); seeds its draw
    banned_ids: list[int] = dataclasses.field(default_factory=list)  # ids it must not sample
    # Rows of a multi-step window: the ids whose sampling ends the request
    # (EOS unless ignore_eos, stop_token_ids); a "while" window stops early
    # on the device once every row has sampled one. The host checks every
    # stop.
    stop_ids: list[int] = dataclasses.field(default_factory=list)
    # Structured outputs: the row samples under its request's grammar. Its
    # mask is filled after the step is enqueued (Scheduler.fill_token_masks),
    # once the token before it has been read.
    constrained: bool = False
    # Speculative decoding: the last this many of token_ids are draft
    # tokens (spec_decode/), verified by this step; the row samples after
    # the token before them, and its pages past what is accepted are
    # given back when the step is read (Scheduler.reject_drafts).
    num_draft_tokens: int = 0


@dataclasses.dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]  # in the order the runner lays out rows
    num_scheduled_tokens: int  # sum of len(token_ids); <= max_num_batched_tokens
    preempted_ids: list[str]  # requests preempted this step (pages freed or swapped)
    finished_ids: list[str]  # requests finished since the last step (pages freed)
    # Copies the runner makes before the step, in this order:
    blocks_to_swap_out: list[tuple[int, int]]  # (device_page, host_slot): device -> host
    blocks_to_swap_in: list[tuple[int, int]]  # (device_page, host_slot): host -> device
    # Requests entering the running batch this step (before their rows run).
    new_requests: list[NewRequestData] = dataclasses.field(default_factory=list)
    # Images to encode before the step, as (request_id, index into its
    # mm_inputs, encoder-cache slot); a slot stays the image's until its
    # last placeholder is scheduled or the request leaves the batch.
    encoder_inputs: list[tuple[str, int, int]] = dataclasses.field(
        default_factory=list)
    # Decode steps the program runs (multi-step scheduling): > 1 only when
    # every row is one decode token; each row then samples num_steps
    # tokens, each the input of the next, its pages already allocated.
    num_steps: int = 1

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls([], 0, [], [], [], [])

    @property
    def has_copies(self) -> bool:
        return bool(self.blocks_to_swap_out or self.blocks_to_swap_in)

    @property
    def is_empty(self) -> bool:
        """Nothing for the runner to do: no tokens, no page copies, and no
        finished or preempted request whose state (penalty slot, what it
        was sent) the runner must drop."""
        return not (self.scheduled or self.has_copies or self.finished_ids
                    or self.preempted_ids)
