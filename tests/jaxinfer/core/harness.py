"""A pure-Python stand-in for the device: drives the real `Scheduler` and
checks its bookkeeping after every step.

`FakeRunner` keeps, per device page and host slot, the token ids "written"
at each offset (the K/V of a real pool stand for exactly those tokens). It
applies the step's swap-out, swap-in and copy-on-write pairs in the runner's
order, then checks that every scheduled request's block table holds its own
tokens at every position attention would read, before writing the new ones.
So a wrong prefix-cache hit, a missed copy-on-write or a lost swap shows up
as wrong "K/V".
"""

from __future__ import annotations

import random

from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.policy import priority_key
from jaxinfer.core.scheduler import Scheduler
from jaxinfer.request import PENDING_TOKEN, Request, RequestStatus
from jaxinfer.sampling_params import SamplingParams

EOS = 0


class FakeRunner:
    """A device that stores token ids in pages. It keeps each sequence as it
    knows it (``seq``: prompt and every token it sampled, read by the host
    or not), feeds pending tokens (PENDING_TOKEN) from there as the real
    runner does from its last output, and checks that every position a row
    attends to holds that sequence's token."""

    def __init__(self, num_blocks: int, num_host: int, block_size: int):
        self.B = block_size
        self.device = [[None] * block_size for _ in range(num_blocks)]
        self.host = [[None] * block_size for _ in range(num_host)]
        self.seq: dict[str, list[int]] = {}

    def execute(self, out, requests, rng: random.Random) -> dict[str, int]:
        for page, slot in out.blocks_to_swap_out:
            self.host[slot] = list(self.device[page])
        for page, slot in out.blocks_to_swap_in:
            self.device[page] = list(self.host[slot])
        sampled = {}
        for s in out.scheduled:
            req = requests[s.request_id]
            seq = self.seq.setdefault(s.request_id, list(req.prompt_token_ids))
            known = req.all_token_ids
            assert seq[:len(known)] == known, "host and device disagree"
            for pos in range(s.start_pos):  # what attention reads
                page = s.block_table[pos // self.B]
                got = self.device[page][pos % self.B]
                assert got == seq[pos], (
                    f"{s.request_id}: position {pos} in page {page} holds "
                    f"{got}, expected {seq[pos]}")
            for j, tok in enumerate(s.token_ids):
                pos = s.start_pos + j
                if tok == PENDING_TOKEN:  # sampled by the step before
                    assert pos >= len(known)
                    tok = seq[pos]
                assert tok == seq[pos]
                self.device[s.block_table[pos // self.B]][pos % self.B] = tok
            if s.sample:
                assert s.start_pos + len(s.token_ids) == len(seq)
                tok = EOS if rng.random() < 0.05 else rng.randrange(1, 50)
                seq.append(tok)
                sampled[s.request_id] = tok
        return sampled


def check_invariants(sched: Scheduler) -> None:
    kv, pool = sched.kv, sched.kv.pool
    holders = [0] * pool.num_blocks
    for table in kv.block_tables.values():
        for p in table:
            assert p != 0, "the null page was handed out"
            holders[p] += 1
    assert pool.ref_cnt == holders, "ref counts differ from block-table holders"
    free = pool.free_pages()
    assert len(free) == len(set(free)), "a page is free twice"
    assert set(free) == {p for p in range(1, pool.num_blocks) if holders[p] == 0}
    for h, p in pool.cached.items():
        assert pool.page_hash[p] == h
    assert sum(h is not None for h in pool.page_hash) == len(pool.cached)
    slots = [s for t in kv.host_tables.values() for s in t]
    assert len(slots) == len(set(slots)), "a host slot is held twice"
    assert len(slots) + kv.host.num_free == kv.host.num_slots
    for req in sched.running:
        assert req.status == RequestStatus.RUNNING
        assert req.request_id in kv.block_tables
        assert req.request_id not in kv.host_tables
    for req in sched.waiting:
        if req.status == RequestStatus.SWAPPED:
            assert req.request_id in kv.host_tables
            assert req.request_id not in kv.block_tables
        else:
            assert req.request_id not in kv.block_tables
            assert req.num_computed_tokens == 0
    assert len(sched.running) <= sched.config.max_num_seqs
    live = {r.request_id for r in sched.running} | \
        {r.request_id for r in sched.waiting}
    assert live == set(sched.requests)
    assert set(kv.block_tables) <= live and set(kv.host_tables) <= live


class Driver:
    """Random traffic against one scheduler; records every request's fate."""

    def __init__(self, *, num_blocks=24, block_size=4, max_tokens=32,
                 max_seqs=6, policy="fcfs", mode="recompute", host_blocks=16,
                 caching=True, chunked=True, max_model_len=64, seed=0,
                 overlap=False):
        max_seqs = min(max_seqs, max_tokens)  # vLLM: seats <= token budget
        sc = SchedulerConfig(max_model_len=max_model_len, max_num_seqs=max_seqs,
                             max_num_batched_tokens=max_tokens,
                             enable_chunked_prefill=chunked, policy=policy,
                             preemption_mode=mode)
        cc = CacheConfig(block_size=8 if block_size == 4 else block_size,
                         enable_prefix_caching=caching)
        # CacheConfig validates vLLM's page sizes; the property tests want
        # smaller pages to get more page traffic, so patch it after.
        object.__setattr__(cc, "block_size", block_size)
        self.sched = Scheduler(sc, cc, num_blocks, host_blocks)
        self.runner = FakeRunner(num_blocks, host_blocks, block_size)
        self.rng = random.Random(seed)
        self.overlap = overlap
        self._pending = None  # (SchedulerOutput, sampled) not yet read
        self.max_model_len = max_model_len
        self.prefixes = [[self.rng.randrange(1, 50) for _ in range(n)]
                         for n in (3, 9, 17)]
        self.fates: dict[str, RequestStatus] = {}
        self.added: list[str] = []
        self.n = 0
        self.admission = {}  # request id -> step of its latest admission

    def add(self, prefix: int, suffix_len: int, priority: int, max_tokens: int,
            arrival: float | None = None) -> None:
        prompt = (self.prefixes[prefix] if prefix < len(self.prefixes) else []) \
            + [self.rng.randrange(1, 50) for _ in range(suffix_len)]
        self._queue(prompt, priority, max_tokens, arrival)

    def _queue(self, prompt, priority, max_tokens, arrival=None) -> None:
        prompt = prompt[:self.max_model_len - 1] or [1]
        rid = f"r{self.n}"
        self.n += 1
        sp = SamplingParams(max_tokens=max_tokens, temperature=0)
        self.sched.add_request(Request(
            rid, prompt, sp, (EOS,), arrival_time=arrival if arrival is not None
            else float(self.n), priority=priority,
            max_model_len=self.max_model_len))
        self.added.append(rid)

    def add_siblings(self, n: int, prompt_len: int, max_tokens: int) -> None:
        """n requests with one prompt, queued together: the samples of an
        n > 1 request, which share its full pages through the prefix cache."""
        prompt = [self.rng.randrange(1, 50) for _ in range(prompt_len)]
        for _ in range(n):
            self._queue(prompt, 0, max_tokens)

    def abort(self, k: int) -> None:
        live = sorted(self.sched.requests)
        if live:
            rid = live[k % len(live)]
            self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            self.fates[rid] = RequestStatus.FINISHED_ABORTED

    def step(self) -> None:
        """One engine step. With overlap, the step is scheduled and run on
        the fake device before the previous step's tokens are read (the
        engine's async scheduling); otherwise its own tokens are read at
        once."""
        if not self.overlap:
            self._schedule_and_run()
            self._read_pending()
            return
        self._schedule_and_run()

    def _read_pending(self) -> None:
        if self._pending is None:
            return
        out, sampled = self._pending
        self._pending = None
        for req in self.sched.update_from_output(out, sampled):
            if req.is_finished:
                self.fates[req.request_id] = req.status
        check_invariants(self.sched)

    def _schedule_and_run(self) -> None:
        s = self.sched
        before_running = [r.request_id for r in s.running]
        waiting_before = list(s.waiting)
        out = s.schedule()
        cfg = s.config
        assert out.num_scheduled_tokens == sum(len(x.token_ids) for x in out.scheduled)
        assert out.num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert len(out.scheduled) <= cfg.max_num_seqs
        assert len({x.request_id for x in out.scheduled}) == len(out.scheduled)
        assert all(x.token_ids for x in out.scheduled), "a row with no tokens"
        self._check_order(before_running, waiting_before, out)
        requests = dict(s.requests)
        sampled = self.runner.execute(out, requests, self.rng)
        previous, self._pending = self._pending, (out, sampled)
        if previous is not None:  # overlap: read step N after N+1 started
            self._pending, newest = previous, self._pending
            self._read_pending()
            self._pending = newest

    def _check_order(self, before_running, waiting_before, out) -> None:
        s = self.sched
        running_ids = {r.request_id for r in s.running}
        admitted = [r for r in waiting_before if r.request_id in running_ids]
        still_waiting = [r for r in s.waiting]
        for r in admitted:
            self.admission[r.request_id] = self.n_steps
        if s.policy.name == "priority":
            for r in admitted:
                for w in still_waiting:
                    assert priority_key(r) <= priority_key(w), (
                        f"admitted {r} before higher-priority {w}")
            for vid in out.preempted_ids:
                victim = next(r for r in waiting_before + list(s.waiting)
                              if r.request_id == vid)
                for r in s.running:
                    assert priority_key(victim) >= priority_key(r), (
                        f"preempted {victim} while lower-priority {r} runs")
        else:
            if admitted:  # the queue head goes first
                assert [r.request_id for r in admitted] == \
                    [r.request_id for r in waiting_before[:len(admitted)]]
            for vid in out.preempted_ids:
                for r in s.running:
                    assert self.admission.get(vid, -1) >= \
                        self.admission.get(r.request_id, -1)

    n_steps = 0

    def run(self, ops) -> None:
        for op in ops:
            kind = op[0]
            if kind == "add":
                self.add(*op[1:])
            elif kind == "abort":
                self.abort(op[1])
            elif kind == "siblings":
                self.add_siblings(*op[1:])
            else:
                self.n_steps += 1
                self.step()

    def drain(self, max_steps: int = 5000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_unfinished_requests():
                break
            self.n_steps += 1
            self.step()
        self._read_pending()
        assert not self.sched.has_unfinished_requests(), "requests never finished"
        for rid in self.added:
            assert self.fates.get(rid) in (
                RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                RequestStatus.FINISHED_ABORTED), f"{rid} has no final state"
        pool = self.sched.kv.pool
        assert pool.num_free == pool.num_blocks - 1, "pages leaked"
        assert self.sched.kv.host.num_free == self.sched.kv.host.num_slots
