"""`Scheduler`: picks each step's batch under a token and a sequence budget.

One rule covers prefill and decode (as in vLLM V1): a request has
``num_computed_tokens`` of its ``num_tokens`` in pages, and a step schedules up
to the difference. Running requests go first (decodes and continuing prefill
chunks), then waiting requests in arrival order, their prompts cut into chunks
that fill the remaining budget. When pages run out, the most recently admitted
running request is preempted by recompute: its pages are freed and it goes back
to the front of the waiting queue.
"""

from __future__ import annotations

import collections
import time

from ..config import CacheConfig, SchedulerConfig
from ..request import Request, RequestStatus
from .kv_cache_manager import KVCacheManager
from .scheduler_output import ScheduledRequest, SchedulerOutput


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, num_blocks: int):
        self.config = scheduler_config
        self.cache_config = cache_config
        self.kv = KVCacheManager(num_blocks, cache_config.block_size)
        self.requests: dict[str, Request] = {}
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._finished_ids: list[str] = []
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids, status: RequestStatus) -> None:
        """Ends requests from outside the step (abort, stop string)."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            if req in self.running:
                self.running.remove(req)
            elif req in self.waiting:
                self.waiting.remove(req)
            req.status = status
            self._free(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _free(self, req: Request) -> None:
        req.finished_time = time.time()
        self.kv.free(req)
        self.requests.pop(req.request_id, None)
        self._finished_ids.append(req.request_id)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- one step ---------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[str] = []

        # 1. Running requests: decodes and unfinished prefill chunks.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while self.kv.allocate_slots(req, num_new) is None:
                victim = self.running[-1]  # the latest admitted
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append((req, num_new))
                budget -= num_new
                i += 1
                continue
            # req preempted itself; the list shifted, i now points past it.

        # 2. Waiting requests, in order, while budget, seats and pages last.
        while (self.waiting and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            num_new = req.num_tokens - req.num_computed_tokens
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            if self.kv.allocate_slots(req, num_new) is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.time()
            self.running.append(req)
            scheduled.append((req, num_new))
            budget -= num_new

        out = []
        for req, n in scheduled:
            start = req.num_computed_tokens
            out.append(ScheduledRequest(
                request_id=req.request_id,
                token_ids=req.all_token_ids[start:start + n],
                start_pos=start,
                block_table=list(self.kv.block_table(req.request_id)),
                sample=start + n == req.num_tokens))
            # Counted as computed now: the step that runs them is already
            # enqueued when the next schedule() is called.
            req.num_computed_tokens += n
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(out, self.config.max_num_batched_tokens - budget,
                               preempted, finished)

    def update_from_output(self, output: SchedulerOutput,
                           sampled: dict[str, int]) -> list[Request]:
        """Appends each sampled token, applies token-level stops and frees
        finished requests. Returns the requests that got a new token."""
        updated = []
        now = time.time()
        for sr in output.scheduled:
            req = self.requests.get(sr.request_id)
            if req is None or req.is_finished or not sr.sample:
                continue
            if req.status != RequestStatus.RUNNING:
                continue  # preempted after being scheduled
            req.append_output_token(sampled[sr.request_id])
            if req.first_token_time is None:
                req.first_token_time = now
            if req.check_stop():
                self.running.remove(req)
                self._free(req)
            updated.append(req)
        return updated
