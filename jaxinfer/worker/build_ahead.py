"""Building the next decode bucket's program while the current step runs.

Without warm-up, a step program is built (traced, then compiled or read
from the compilation cache) when the first step of its bucket is
dispatched. A new request's prefill and its first decode step land in two
buckets, so a `generate` would wait for two builds one after the other
(even from a warm compilation cache, reading it takes time). The decode
bucket that follows a step is known when that step is scheduled: its
sampling rows, one token each, one position further. So `BuildAhead`
starts that program's build on a background thread before the step is
dispatched, and `StepPrograms` takes the result when the decode step
comes (`take`). The two builds overlap (the
reads and XLA compiles run outside the GIL, on the host's other core), as
does the build with the device's work.

The same holds when running sequences near the end of their page bucket
(`LOOKAHEAD_TOKENS` ahead): the wider bucket's program is built ahead.

A first request's programs start even earlier (`start_first`): without
warm-up, the engine builds the programs of one short prompt (its prefill
in the smallest token bucket, its first decode bucket, the greedy and
sampled sampler of each) from the params' and pages' expected shapes
while the weights load, on CPU, where nothing else uses the second core
then. A guess: the runner checks it against what was loaded
(`confirm_first`), and a first request of another shape builds its own
programs, the guess's builds not yet started cancelled
(`drop_missed_first`).

Single-step forward programs only: multi-step windows and steps with LoRA
adapters build on first use (their keys depend on what the scheduler
picks), and with warm-up everything is already built.
``JAXINFER_BUILD_AHEAD=0`` turns it off (each program builds on first use).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

import jax

from ..core.kv_cache_manager import cdiv
from ..core.scheduler_output import NewRequestData, SchedulerOutput
from ..sampling_params import SamplingParams
from . import warmup
from .buckets import Bucket, Buckets
from .program_keys import FORWARD, ModelProgram, ProgramBuild, ProgramKey

if TYPE_CHECKING:
    from .step_programs import DeviceState, StepPrograms

logger = logging.getLogger(__name__)

# How many tokens ahead a running sequence's next page bucket is built.
LOOKAHEAD_TOKENS = 32

# Python's thread switch interval while builds run (a tenth of the
# default). The build thread traces (holding the GIL) while the main thread
# places weights or steps, which drops the GIL around each copy or program
# run and then waits up to a whole interval to get it back: a short
# interval keeps the main thread's work from stretching behind a build.
SWITCH_INTERVAL_S = 0.0005
_switch_lock = threading.Lock()
_builds_running = 0
_saved_interval = sys.getswitchinterval()  # restored when builds stop


def _build_started() -> None:
    global _builds_running, _saved_interval
    with _switch_lock:
        if _builds_running == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL_S))
        _builds_running += 1


def _build_done() -> None:
    global _builds_running
    with _switch_lock:
        _builds_running -= 1
        if _builds_running == 0:
            sys.setswitchinterval(_saved_interval)


# The sampling a first request most likely asks for: greedy (`jaxinfer
# generate`'s default) and plain sampling (SamplingParams' default,
# temperature 1).
FIRST_SAMPLING = (SamplingParams(temperature=0.0),
                  SamplingParams(temperature=1.0))


def _env_allows() -> bool:
    """``JAXINFER_BUILD_AHEAD=0`` turns building ahead off."""
    return os.environ.get("JAXINFER_BUILD_AHEAD", "1") != "0"


def first_request_buckets(buckets: Buckets) -> list[Bucket]:
    """The buckets of a first request whose prompt fits the smallest token
    bucket: its prefill step, then its decode steps (the first page
    bucket)."""
    return [buckets.bucket(buckets.tokens[0], 1, 1), buckets.bucket(1, 1, 1)]


def _same_layout(expected, actual) -> bool:
    """Whether two array trees have one structure and, leaf by leaf, the
    same shape, dtype and (equivalent) sharding."""
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    # jaxlib ships PyTreeDef without stubs; it compares by structure.
    if e_def != a_def:  # type: ignore[operator]
        return False
    for e, a in zip(e_leaves, a_leaves):
        if e.shape != a.shape or e.dtype != a.dtype:
            return False
        if not e.sharding.is_equivalent_to(a.sharding, len(e.shape)):
            return False
    return True


def abstract(tree):
    """Arrays -> ShapeDtypeStructs (with their shardings): lowering reads
    nothing else, and a donated page pool may be gone by the time the
    background thread lowers."""
    def one(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x
    return jax.tree_util.tree_map(one, tree)


class BuildAhead:
    """Background builds of upcoming decode buckets' forward programs for
    one `StepPrograms`; one worker thread (builds queue behind each other)."""

    def __init__(self, programs: StepPrograms):
        self.programs = programs
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._building: dict[ProgramKey, concurrent.futures.Future] = {}
        self._seen: set[Bucket] = set()  # buckets already looked at
        # Decided at the first request and fixed for the runner's life, so
        # the per-step call returns at once where nothing is ever built
        # ahead; warm-up clears it (`stop`).
        self.enabled: bool | None = None
        # start_first's forward keys and expected state, until confirmed.
        self._first: tuple | None = None
        # start_first's guessed first step and every key it queued, until
        # the first real step is seen (`drop_missed_first`).
        self._first_guess: tuple | None = None

    def stop(self) -> None:
        """Nothing more to build ahead (warm-up built every bucket)."""
        self.enabled = False

    def close(self) -> None:
        """Nothing more to build, and the builds not started cancelled:
        at exit Python runs every queued job of a thread pool before it
        joins the pool's thread, so a process ending with builds queued
        would compile each first (tens of seconds on a busy CPU)."""
        self.enabled = False
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def decode_buckets_after(self, out: SchedulerOutput,
                             requests: dict[str, NewRequestData]
                             ) -> list[Bucket]:
        """The decode-only buckets that follow ``out``: its sampling rows
        that decode again, one position further and LOOKAHEAD_TOKENS
        further (no further than their max_tokens). ``requests``: what the
        runner knows of each request."""
        programs = self.programs
        # Each sampling row's end: the last position whose K/V a decode
        # step writes (its last token's is never written).
        ends = {}
        for s in out.scheduled:
            req = requests.get(s.request_id)
            if req is None:
                continue
            if not s.sample:
                # A prompt still prefilling: the next step has its next
                # chunk, so it is not decode-only, and the decode steps
                # after its last chunk have one row more than this step's
                # sampling rows (and maybe its wider pages): a guess from
                # here is a build no step takes.
                return []
            end = programs.scheduler_config.max_model_len
            max_tokens = req.sampling_params.max_tokens
            if max_tokens is not None:
                end = min(end, req.num_prompt_tokens + max_tokens - 1)
            if s.start_pos + len(s.token_ids) < end:  # it decodes again
                ends[s.request_id] = (s.start_pos + len(s.token_ids), end)
        if not ends:
            return []
        n = len(ends)
        buckets: list[Bucket] = []
        for ahead in (1, LOOKAHEAD_TOKENS):
            pages = max(cdiv(min(pos + ahead, end), programs.block_size)
                        for pos, end in ends.values())
            bucket = programs.buckets.bucket(n, n, pages)
            if bucket not in buckets:
                buckets.append(bucket)
        return buckets

    def _allowed(self) -> bool:
        """Decided once, at the first call, and fixed for the runner's life,
        so the per-step call returns at once where nothing is ever built
        ahead."""
        if self.enabled is None:
            self.enabled = (
                _env_allows() and self.programs.lora_config is None
                and self.programs.scheduler_config.num_scheduler_steps == 1
                # Its forward programs score one row per sequence.
                and not self.programs.num_speculative_tokens)
        return self.enabled

    def _submit(self, key: ProgramKey, build: ProgramBuild) -> None:
        """Lowers and compiles ``build`` on the worker thread, from its
        arguments' ShapeDtypeStructs, under ``key``."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="jaxinfer-build-ahead")
        args = abstract(build.args)

        def compile_it():
            try:
                t0 = time.perf_counter()
                program = build.jitted.lower(*build.static, *args).compile()
                logger.debug("built %s %s ahead in %.2fs", key.kind,
                             key[1], time.perf_counter() - t0)
                return program
            finally:
                _build_done()
        _build_started()
        self._building[key] = self._pool.submit(compile_it)

    def start_first(self, state: DeviceState) -> bool:
        """Starts building a first request's programs (`first_request_buckets`
        with each `FIRST_SAMPLING` sampler) from ``state``, the runner's
        expected state (the params and pages as they will be). Returns
        whether it started (not when building ahead is off). Called before
        the weights load."""
        programs = self.programs
        if not _env_allows():
            return False
        buckets = first_request_buckets(programs.buckets)
        todo: dict[ProgramKey, ProgramBuild] = {}  # in build order
        # In the order the first request needs them: the prefill and its
        # samplers (greedy or sampled: small builds) give the first token,
        # then the decode bucket and its samplers. Everything is laid out
        # before the first build starts, so a failure here leaves nothing
        # half-queued.
        try:
            for bucket in buckets:
                key, build = warmup.forward_build(programs, bucket, state)
                todo[key] = build
                for sp in FIRST_SAMPLING:
                    key, build = warmup.sample_build(programs, bucket.seqs, sp,
                                                     state.prev_tokens)
                    todo.setdefault(key, build)
        except Exception:
            logger.warning("could not lay out a first request's programs; "
                           "they build on first use", exc_info=True)
            return False
        for key, build in todo.items():
            self._submit(key, build)
        self._first = ([k for k in todo if k.kind == FORWARD], state)
        self._first_guess = (buckets[0], list(todo))
        return True

    def drop_missed_first(self, out: SchedulerOutput) -> int:
        """At the engine's first step: if its bucket is not the one
        `start_first` guessed (a batch of prompts, say), cancels the guessed
        builds that have not started, so they do not take the host's other
        core from the steps that run. Returns how many it cancelled."""
        if self._first_guess is None:
            return 0
        guessed, keys = self._first_guess
        self._first_guess = None
        bucket = self.programs.bucket(out)
        if bucket == guessed:
            return 0
        cancelled = 0
        for key in keys:
            future = self._building.get(key)
            if future is not None and future.cancel():
                # A cancelled build never runs: its count ends here.
                del self._building[key]
                _build_done()
                cancelled += 1
        logger.debug("first step in bucket %s, not %s: cancelled %d builds",
                     bucket, guessed, cancelled)
        return cancelled

    def confirm_first(self, params, kv_pages) -> bool:
        """Keeps the first request's forward programs if ``params`` and
        ``kv_pages`` (as loaded and allocated) have the layout
        `start_first` expected, else drops them (those steps build their
        programs as usual). The samplers read neither and stay."""
        if self._first is None:
            raise RuntimeError("confirm_first without a start_first that "
                               "returned True")
        forward_keys, expected = self._first
        self._first = None
        same = (_same_layout(expected.params, params)
                and _same_layout(expected.kv_pages, kv_pages))
        if not same:
            logger.info("the weights or pages loaded in another layout than "
                        "expected: a first request builds its programs on "
                        "first use")
            for key in forward_keys:
                self._building.pop(key, None)
        return same

    def request(self, out: SchedulerOutput, state: DeviceState,
                requests: dict[str, NewRequestData]) -> None:
        """Starts building the programs of the decode buckets after ``out``
        that are neither built nor being built."""
        programs = self.programs
        if not self._allowed() or out.num_steps > 1:
            return
        for bucket in self.decode_buckets_after(out, requests):
            if bucket in self._seen:
                continue
            self._seen.add(bucket)
            if programs.has_run(ModelProgram(1, bucket)):
                continue
            key, build = warmup.forward_build(programs, bucket, state)
            if key in programs.built or key in self._building:
                continue
            self._submit(key, build)

    def take(self, key: ProgramKey):
        """The program built ahead for ``key`` (waiting for its build), or
        None when none was started or its build failed (the caller builds
        it as usual)."""
        future = self._building.pop(key, None)
        if future is None:
            return None
        try:
            return future.result()
        except Exception:
            logger.warning("building a decode program ahead failed; building "
                           "it on first use instead", exc_info=True)
            return None

    def pending(self) -> int:
        """Builds started and not yet taken."""
        return len(self._building)
