"""`Scheduler`: picks each step's batch under a token and a sequence budget.

One rule covers prefill and decode (as in vLLM V1): a request has
``num_computed_tokens`` of its ``num_tokens`` in pages, and a step schedules up
to the difference. Running requests go first (decodes and continuing prefill
chunks), then waiting requests in policy order (`policy.py`), their prompts
cut into chunks that fill the remaining budget, with prefix-cache hits skipped.

When pages run out, the running request the policy ranks last is preempted:
by recompute (pages freed, it starts over later, mostly from the prefix
cache) or by swap (pages copied to host slots and back when there is room;
the runner does the copies, from the pairs in `SchedulerOutput`). A request
whose pages do not fit in the host space is recomputed instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..config import CacheConfig, SchedulerConfig
from ..request import Request, RequestStatus, banned_ids
from ..structured.bitmask import fill_bitmasks
from .encoder_cache_manager import EncoderCacheManager
from .kv_cache_manager import KVCacheManager
from .lora_budget import AdapterBudget
from .policy import Policy
from .scheduler_output import NewRequestData, ScheduledRequest, SchedulerOutput
from .speculation import Speculation

if TYPE_CHECKING:
    from ..spec_decode.config import SpeculativeConfig


def _stop_ids(req: Request) -> list[int]:
    """The token ids whose sampling ends ``req`` (past min_tokens, which a
    window's rows are)."""
    sp = req.sampling_params
    eos = [] if sp.ignore_eos else list(req.eos_token_ids)
    return eos + list(sp.stop_token_ids or ())


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, num_blocks: int,
                 num_host_blocks: int = 0, num_encoder_slots: int = 0,
                 max_loras: int | None = None,
                 speculative_config: SpeculativeConfig | None = None):
        self.config = scheduler_config
        self.cache_config = cache_config
        self.kv = KVCacheManager(num_blocks, cache_config.block_size,
                                 cache_config.enable_prefix_caching,
                                 num_host_blocks)
        # Slots of the encoder-output cache (models that take images).
        self.encoder = (EncoderCacheManager(num_encoder_slots)
                        if num_encoder_slots else None)
        self.policy = Policy(scheduler_config.policy)
        self.adapters = AdapterBudget(max_loras)  # None: LoRA off
        # Draft tokens for decoding requests (None: speculation off).
        self.speculation = (Speculation(speculative_config)
                            if speculative_config is not None else None)
        self.requests: dict[str, Request] = {}
        self.waiting = self.policy.make_queue()  # new, preempted and swapped
        self.running: list[Request] = []  # ordered: last = first to preempt
        self._finished_ids: list[str] = []
        self.num_preemptions = 0  # since start
        self.num_swap_outs = 0  # preemptions by swap, since start

    # -- queue management -------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: str | Iterable[str],
                        status: RequestStatus) -> None:
        """Ends requests from outside the step (abort, stop string)."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            req.status = status
            self._free(req)

    def has_unfinished_requests(self) -> bool:
        return bool(len(self.waiting) or self.running)

    def running_fit(self, num_tokens: int) -> bool:
        """Whether every running request can take the pages of
        ``num_tokens`` more tokens at once (so a step scheduled now
        preempts nobody)."""
        kv, B = self.kv, self.kv.block_size
        needed = sum(max(0, -(-(r.num_computed_tokens + num_tokens) // B)
                         - len(kv.block_table(r.request_id)))
                     for r in self.running)
        return needed <= kv.pool.num_free

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_swapped(self) -> int:
        return len(self.kv.host_tables)

    def _free(self, req: Request) -> None:
        req.finished_time = time.time()
        self.kv.free(req)
        if self.encoder is not None:
            self.encoder.free(req.request_id)
        self.requests.pop(req.request_id, None)
        self._finished_ids.append(req.request_id)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        if self.encoder is not None:  # the runner drops its encoder outputs
            self.encoder.free(req.request_id)
        pairs = None
        if self.config.preemption_mode == "swap":
            pairs = self.kv.swap_out(req)
        if pairs is None:  # recompute (or the host space is full)
            self.kv.free(req)
            req.status = RequestStatus.PREEMPTED
            req.num_computed_tokens = 0
        else:
            req.status = RequestStatus.SWAPPED
            out.blocks_to_swap_out.extend(pairs)
            self.num_swap_outs += 1
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_ids.append(req.request_id)
        self.waiting.prepend(req)

    # -- one step ---------------------------------------------------------

    @staticmethod
    def _prompt_lp_rows(req: Request, start: int, num_new: int) -> int:
        """Prompt tokens a chunk of ``num_new`` tokens from ``start`` scores
        for prompt logprobs (each position but the prompt's last scores the
        next token)."""
        if req.sampling_params.prompt_logprobs is None:
            return 0
        return max(0, min(start + num_new, req.num_prompt_tokens - 1) - start)

    def _prompt_lp_fit(self, req: Request, start: int, num_new: int,
                       lp_budget: int) -> int:
        """``num_new`` cut so that the chunk's scored prompt tokens fit
        ``lp_budget``."""
        if self._prompt_lp_rows(req, start, num_new) <= lp_budget:
            return num_new
        return max(lp_budget, 0)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput.make_empty()
        budget = self.config.max_num_batched_tokens
        # Prompt tokens scored for prompt logprobs, a budget of its own
        # (SchedulerConfig.max_prompt_logprob_rows).
        lp_budget = self.config.max_prompt_logprob_rows
        scheduled: list[tuple[Request, int]] = []
        drafts = ({} if self.speculation is None
                  else self.speculation.propose(self.running))

        # 1. Running requests: decodes and unfinished prefill chunks.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens_with_pending - req.num_computed_tokens
                          + len(drafts.get(req.request_id, ())), budget)
            if num_new <= 0 or req.out_of_budget_with_pending():
                i += 1
                continue
            # Once per running request and step: the common case (no prompt
            # logprobs) costs one attribute test.
            scores_prompt = req.sampling_params.prompt_logprobs is not None
            if scores_prompt:
                num_new = self._prompt_lp_fit(req, req.num_computed_tokens,
                                              num_new, lp_budget)
                if num_new <= 0:  # its prompt-logprob chunk waits a step
                    i += 1
                    continue
            num_new, images = self._plan_images(req, req.num_computed_tokens,
                                                num_new)
            if num_new <= 0:  # its next image has no encoder slot yet
                i += 1
                continue
            while not self.kv.allocate_slots(req, num_new):
                victim = self.running[-1]  # ranked last by the policy
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                self._commit_images(req, images, out)
                scheduled.append((req, num_new))
                budget -= num_new
                if scores_prompt:
                    lp_budget -= self._prompt_lp_rows(
                        req, req.num_computed_tokens, num_new)
                i += 1
            # When req preempted itself, i already points past it.

        # 2. Waiting requests, in policy order, while budget, seats and pages
        # last. Nothing is admitted in a step that had to preempt. A request
        # whose LoRA adapter would exceed max_loras is passed over.
        self.adapters.start(self.running)
        passed_over: list[Request] = []
        while (len(self.waiting) and budget > 0 and not out.preempted_ids
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting.peek()
            if not self.adapters.admits(req):
                passed_over.append(self.waiting.pop())
                continue
            if req.status == RequestStatus.SWAPPED:
                num_new = self._prompt_lp_fit(
                    req, req.num_computed_tokens,
                    min(req.num_tokens - req.num_computed_tokens, budget),
                    lp_budget)
                num_new, images = self._plan_images(
                    req, req.num_computed_tokens, num_new)
                if num_new <= 0:
                    break
                pairs = self.kv.swap_in(req, num_new)
                if pairs is None:
                    break
                out.blocks_to_swap_in.extend(pairs)
            else:
                pages, num_hit = self.kv.get_computed_blocks(req)
                num_new = req.num_tokens - num_hit
                if not self.config.enable_chunked_prefill and num_new > budget:
                    break
                num_new = self._prompt_lp_fit(req, num_hit,
                                              min(num_new, budget), lp_budget)
                if num_new <= 0:
                    break
                fit, images = self._plan_images(req, num_hit, num_new)
                if fit < num_new and (
                        fit <= 0 or not self.config.enable_chunked_prefill):
                    break  # an image without an encoder slot: next step
                num_new = fit
                if not self.kv.allocate_slots(req, num_new, pages):
                    break
                self.kv.record_query(req.num_tokens, num_hit)
                req.num_computed_tokens = num_hit
                if req.first_scheduled_time is None:
                    req.num_cached_tokens = num_hit
            self.waiting.pop()
            self._commit_images(req, images, out)
            out.new_requests.append(NewRequestData(
                req.request_id, req.all_token_ids, req.num_prompt_tokens,
                req.sampling_params, mm_inputs=req.mm_inputs,
                lora_request=req.lora_request))
            self.adapters.admit(req)
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.time()
            self.policy.admit(self.running, req)
            scheduled.append((req, num_new))
            budget -= num_new
            lp_budget -= self._prompt_lp_rows(req, req.num_computed_tokens,
                                              num_new)
        for req in reversed(passed_over):  # back in their places
            self.waiting.prepend(req)

        num_steps = self._multi_step_window(scheduled, out)
        out.num_steps = num_steps
        for req, n in scheduled:
            start = req.num_computed_tokens
            # Drafts that fit the budget (n counts the row's one known token).
            d = min(len(drafts.get(req.request_id, ())), n - 1)
            sample = start + n - d == req.num_tokens_with_pending
            out.scheduled.append(ScheduledRequest(
                request_id=req.request_id,
                token_ids=(req.token_ids_between(start, start + n - d)
                           + drafts[req.request_id][:d] if d else
                           req.token_ids_between(start, start + n)),
                num_draft_tokens=d,
                start_pos=start,
                block_table=list(self.kv.block_table(req.request_id)),
                sample=sample,
                # Output tokens before the one this row samples, pending
                # ones (still on the device) included.
                sample_index=(len(req.output_token_ids)
                              + req.num_pending_tokens if sample else 0),
                banned_ids=banned_ids(req) if sample else [],
                stop_ids=_stop_ids(req) if num_steps > 1 else [],
                constrained=sample and req.grammar is not None))
            # Counted as computed now: the step that runs them is already
            # enqueued when the next schedule() is called. Its sampled token
            # is pending until update_from_output reads it.
            req.num_computed_tokens += n * num_steps
            # A speculative row may append every draft and one more token;
            # those its step rejects are taken back (reject_drafts).
            req.num_pending_tokens += sample * num_steps + d
            if self.encoder is not None and req.mm_inputs:
                self.encoder.free_consumed(req)
        out.num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        out.finished_ids, self._finished_ids = self._finished_ids, []
        return out

    def fill_token_masks(self, out: SchedulerOutput, bitmask: np.ndarray
                         ) -> None:
        """ANDs each constrained row's next-token mask into its row of
        ``bitmask`` [S, words] int32 (which holds the row's allowed and
        banned ids), all at once (in parallel, off the
        GIL). The engine calls it after the step's forward pass is enqueued
        and the step before it has been read, so each matcher has seen
        every token before the one its row samples while the device runs
        the forward pass. Rows of requests that finished meanwhile keep
        what they have: their token is dropped."""
        rows = []
        for i, sr in enumerate(out.scheduled):
            req = self.requests.get(sr.request_id) if sr.constrained else None
            if req is not None and req.grammar is not None and not req.is_finished:
                rows.append((i, req))
        if rows:
            masks = fill_bitmasks([req.grammar for _, req in rows])
            idx = [i for i, _ in rows]
            bitmask[idx] &= masks

    def _multi_step_window(self, scheduled: list[tuple[Request, int]],
                           out: SchedulerOutput) -> int:
        """How many decode steps this step's program runs: num_scheduler_steps
        when every row is one decode token of a request that needs nothing
        from the host between tokens and samples in the plain tier (no
        allowed ids, bias, logprobs), nobody waits to join the batch, and
        each has room for that many more tokens and the pages for them
        (allocated here); else 1. Only the full window is taken, so each
        bucket has one multi-step program."""
        k = self.config.num_scheduler_steps
        if (k == 1 or not scheduled or out.new_requests or out.preempted_ids
                or out.has_copies or len(self.waiting)):
            return 1
        for req, n in scheduled:
            sp = req.sampling_params
            if (n != 1 or req.num_computed_tokens + 1 != req.num_tokens_with_pending
                    or req.needs_known_tokens or req.grammar is not None
                    or sp.logprobs is not None
                    # A window samples in the plain tier only.
                    or sp.allowed_token_ids or sp.logit_bias
                    or req.mm_inputs or (req.max_tokens is not None and len(
                        req.output_token_ids) + req.num_pending_tokens + k
                        > req.max_tokens)):
                return 1
        for req, _ in scheduled:  # pages for the whole window, or single steps
            if not self.kv.allocate_slots(req, k):
                return 1
        return k

    def _plan_images(self, req: Request, start: int, num_new: int
                     ) -> tuple[int, list[int]]:
        """The tokens of ``req`` that can run from ``start`` given the free
        encoder slots, and its images to encode among them."""
        if self.encoder is None or not req.mm_inputs:
            return num_new, []
        return self.encoder.plan(req, start, num_new)

    def _commit_images(self, req: Request, images: list[int],
                       out: SchedulerOutput) -> None:
        if images:
            if self.encoder is None:
                raise RuntimeError("images planned without an encoder cache")
            out.encoder_inputs.extend(self.encoder.commit(req, images))

    def reject_drafts(self, output: SchedulerOutput,
                      emitted: dict[str, int]) -> None:
        """After a speculative step's tokens are appended (``emitted``: each
        row's count, its accepted drafts and one more): each live row's
        rejected drafts are no longer computed, and its pages past what
        was accepted go back to the pool. A step scheduled after this one
        (host/device overlap) counted them as accepted; it is corrected on
        the device (spec_decode/overlap.py) and keeps its own."""
        for sr in output.scheduled:
            req = self.requests.get(sr.request_id)
            if not sr.num_draft_tokens or req is None or req.is_finished:
                continue
            rejected = sr.num_draft_tokens + 1 - emitted[sr.request_id]
            req.num_pending_tokens -= rejected
            if req.status == RequestStatus.PREEMPTED:
                continue  # recomputed from its known tokens
            req.num_computed_tokens -= rejected
            self.kv.trim(req)

    def update_from_output(self, output: SchedulerOutput,
                           sampled: dict[str, int]) -> list[Request]:
        """Appends each sampled token, applies token-level stops and frees
        finished requests. Returns the requests that got a new token. A
        request preempted after this step was scheduled (host/device overlap
        schedules the next step first) still takes its token: recompute
        starts over with it, swap keeps it."""
        updated = []
        now = time.time()
        for sr in output.scheduled:
            if not sr.sample:
                continue
            req = self.requests.get(sr.request_id)
            if req is None or req.is_finished:
                continue  # finished (or aborted) while this step ran
            if req.pooling_params is not None:  # pooled: its prompt is done
                req.num_pending_tokens -= 1
                req.status = RequestStatus.FINISHED_STOPPED
                if req in self.running:
                    self.running.remove(req)
                else:
                    self.waiting.remove(req)
                self._free(req)
                updated.append(req)
                continue
            token = sampled.get(sr.request_id)
            if token is None:  # a speculative row that emitted fewer tokens
                continue
            req.num_pending_tokens -= 1
            req.append_output_token(token)
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            if req.check_stop():
                if req in self.running:
                    self.running.remove(req)
                else:
                    self.waiting.remove(req)
                self._free(req)
            updated.append(req)
        return updated
