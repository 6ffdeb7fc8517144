"""`Request`: one sequence's state as the scheduler sees it (no JAX here)."""

from __future__ import annotations

import enum
import logging
import time
from typing import TYPE_CHECKING

from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .lora.request import LoRARequest
    from .pooling.params import PoolingParams

logger = logging.getLogger(__name__)


# A token id the host does not know yet: the step that samples it is still
# on the device; the runner feeds it from that step's device output.
PENDING_TOKEN = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue; pages freed (recompute)
    SWAPPED = "swapped"  # pages copied to host memory
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED,
                        RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, eos_token_ids: tuple[int, ...] = (),
                 arrival_time: float | None = None, priority: int = 0,
                 prompt: str | None = None, max_model_len: int | None = None,
                 extra_keys: tuple | None = None, mm_inputs: tuple = (),
                 lora_request: LoRARequest | None = None,
                 pooling_params: PoolingParams | None = None,
                 skip_prefix_cache: bool = False):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = tuple(eos_token_ids)
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        # Tokens whose K/V are in pages (or will be, after the step that
        # scheduled them runs).
        self.num_computed_tokens = 0
        # Tokens sampled by steps still on the device (host/device overlap):
        # counted in the next schedule, appended when their step is read.
        self.num_pending_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache
        self.num_preemptions = 0
        # Prefix caching: the chain of full-block hashes (filled by the KV
        # manager) and what besides tokens makes a block reusable (a LoRA id,
        # multimodal input hashes); requests differing here share no pages.
        self.block_hashes: list = []
        self.extra_keys = extra_keys
        # Images (jaxinfer.multimodal.inputs.MultiModalInput), in prompt
        # order, each over its placeholder tokens.
        self.mm_inputs = tuple(mm_inputs)
        self.lora_request = lora_request  # LoRARequest, None: the base model
        self.stop_reason: int | str | None = None
        # A pooling request: prefilled, pooled, finished; never samples.
        self.pooling_params = pooling_params
        # Every prompt position must be computed (prompt logprobs, pooling
        # over all tokens): no prefix-cache hits.
        self.skip_prefix_cache = (skip_prefix_cache or
                                  sampling_params.prompt_logprobs is not None)
        # Structured outputs: this sequence's own matcher (structured/
        # grammar.py), advanced by each appended token; None: unconstrained.
        grammar = sampling_params.compiled_grammar
        self.grammar = None if grammar is None else grammar.matcher()
        max_tokens = sampling_params.max_tokens
        if max_model_len is not None:
            room = max_model_len - len(self.prompt_token_ids)
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        self.max_tokens = max_tokens
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens_with_pending(self) -> int:
        return self.num_tokens + self.num_pending_tokens

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without building the whole list (the
        scheduler asks every step, and a decode needs one token). Positions
        whose token is still on the device (pending) read as PENDING_TOKEN."""
        known = self.num_tokens
        if end > known:
            return (self.token_ids_between(start, known) if start < known
                    else []) + [PENDING_TOKEN] * (end - max(start, known))
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    def block_extra_keys(self, start: int, end: int) -> tuple | None:
        """What besides its tokens keys the block of positions [start, end):
        the request's extra keys, and the hash of every image whose
        placeholders the block holds (placeholder tokens are all alike, so
        only the hash tells two images apart)."""
        images = tuple(m.hash for m in self.mm_inputs
                       if m.offset < end and m.end > start)
        if not images:
            return self.extra_keys
        return (self.extra_keys, images) if self.extra_keys else images

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def needs_known_tokens(self) -> bool:
        """Whether the next step's inputs depend on every sampled token
        (penalty counts, bad-word prefixes, min_tokens), so the engine must
        not schedule it while a token is still pending. A grammar's mask is
        not among them: it is filled after the step's forward pass is
        enqueued (Scheduler.fill_token_masks)."""
        sp = self.sampling_params
        # A pooled prompt's last chunk ends it: no later step may be
        # scheduled before that step is read.
        return bool(self.pooling_params is not None
                    or sp.presence_penalty or sp.frequency_penalty
                    or sp.repetition_penalty != 1.0 or sp.bad_words
                    or len(self.output_token_ids) < sp.min_tokens)

    def out_of_budget_with_pending(self) -> bool:
        """The pending tokens already reach max_tokens (the context's room
        included): nothing more to schedule for it."""
        return (self.num_pending_tokens > 0 and self.max_tokens is not None
                and len(self.output_token_ids)
                + self.num_pending_tokens >= self.max_tokens)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        if self.grammar is not None and not self.grammar.accept(token_id):
            # The mask allows only tokens the grammar takes, so this is a
            # bug; the request stops (check_stop) rather than going on
            # unconstrained.
            logger.error("request %s: the grammar refused token %d: %s",
                         self.request_id, token_id, self.grammar.error)

    def check_stop(self) -> bool:
        """Token-level stops (EOS, stop_token_ids, max_tokens); stop strings
        are the output processor's job. Sets status when finished."""
        if not self.output_token_ids:
            return False
        sp = self.sampling_params
        last = self.output_token_ids[-1]
        n_out = len(self.output_token_ids)
        if n_out >= sp.min_tokens:
            if not sp.ignore_eos and last in self.eos_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                return True
            if last in (sp.stop_token_ids or ()):
                self.status = RequestStatus.FINISHED_STOPPED
                self.stop_reason = last
                return True
        if self.grammar is not None and self.grammar.finished:
            # The grammar produced its whole output: only EOS could follow.
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if self.max_tokens is not None and n_out >= self.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, "
                f"prompt={self.num_prompt_tokens}, out={len(self.output_token_ids)}, "
                f"computed={self.num_computed_tokens})")


def banned_ids(req: Request) -> list[int]:
    """Ids that must not be sampled next: bad words whose prefix ends the
    output so far, and, before min_tokens, EOS and stop token ids."""
    sp = req.sampling_params
    out = req.output_token_ids
    banned = []
    for word in sp.bad_words_token_ids or ():
        prefix = word[:-1]
        if not prefix or (len(out) >= len(prefix)
                          and out[len(out) - len(prefix):] == prefix):
            banned.append(word[-1])
    if len(out) < sp.min_tokens:
        banned.extend(sp.stop_token_ids or ())
        if not sp.ignore_eos:
            banned.extend(req.eos_token_ids)
    return banned
