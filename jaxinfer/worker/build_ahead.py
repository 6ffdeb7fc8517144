"""Building the next decode bucket's program while the current step runs.

Without warm-up, a step program is built (traced, then compiled or read
from the compilation cache) when the first step of its bucket is
dispatched. A new request's prefill and its first decode step land in two
buckets, so a `generate` waited for two builds one after the other; on
the 2-core CPU each was about 0.5 s with a warm cache (two thirds of it
reading the cache) and 5-10 s cold. The decode bucket that follows a step
is known when that step is scheduled: its sampling rows, one token each,
one position further. So `BuildAhead` starts that program's build on a
background thread before the step is dispatched, and the runner takes the
result when the decode step comes (`take`). The two builds overlap (the
reads and XLA compiles run outside the GIL, on the host's other core), as
does the build with the device's work.

The same holds when running sequences near the end of their page bucket
(`LOOKAHEAD_TOKENS` ahead): the wider bucket's program is built ahead.

Single-step forward programs only: multi-step windows and steps with LoRA
adapters build on first use as before (their keys depend on what the
scheduler picks), and with warm-up everything is already built.
``JAXINFER_BUILD_AHEAD=0`` turns it off (each program builds on first use).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os

import jax
from ..core.kv_cache_manager import cdiv
from ..core.scheduler_output import SchedulerOutput
from .packing import pack_step
from .warmup import dummy_batch

logger = logging.getLogger(__name__)

# How many tokens ahead a running sequence's next page bucket is built.
LOOKAHEAD_TOKENS = 32


def _abstract(tree):
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
    one `ModelRunner`; one worker thread (builds queue behind each other)."""

    def __init__(self, runner):
        self.runner = runner
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._building: dict[tuple, concurrent.futures.Future] = {}
        self._seen: set[tuple] = set()  # buckets already looked at
        # Decided at the first request and fixed for the runner's life, so
        # the per-step call returns at once where nothing is ever built
        # ahead; warm-up clears it (`stop`).
        self.enabled: bool | None = None

    def stop(self) -> None:
        """Nothing more to build ahead (warm-up built every bucket)."""
        self.enabled = False

    def decode_buckets_after(self, out: SchedulerOutput) -> list[tuple]:
        """The decode-only buckets (T, S, P, True) that follow ``out``: its
        sampling rows that decode again, one position further and
        LOOKAHEAD_TOKENS further (no further than their max_tokens)."""
        runner = self.runner
        # Each sampling row's end: the last position whose K/V a decode
        # step writes (its last token's is never written).
        ends = {}
        for s in out.scheduled:
            req = runner.requests.get(s.request_id)
            if not s.sample or req is None:
                continue
            end = runner.scheduler_config.max_model_len
            max_tokens = req.sampling_params.max_tokens
            if max_tokens is not None:
                end = min(end, req.num_prompt_tokens + max_tokens - 1)
            if s.start_pos + len(s.token_ids) < end:  # it decodes again
                ends[s.request_id] = (s.start_pos + len(s.token_ids), end)
        if not ends:
            return []
        n = len(ends)
        out_dims = []
        for ahead in (1, LOOKAHEAD_TOKENS):
            pages = max(cdiv(min(pos + ahead, end), runner.block_size)
                        for pos, end in ends.values())
            dims = (*runner.buckets.pick(n, n, pages, True), True)
            if dims not in out_dims:
                out_dims.append(dims)
        return out_dims

    def request(self, out: SchedulerOutput) -> None:
        """Starts building the programs of the decode buckets after ``out``
        that are neither built nor being built."""
        runner = self.runner
        if self.enabled is None:
            self.enabled = (os.environ.get("JAXINFER_BUILD_AHEAD", "1") != "0"
                            and runner.lora is None and
                            runner.scheduler_config.num_scheduler_steps == 1)
        if not self.enabled or out.num_steps > 1:
            return
        for dims in self.decode_buckets_after(out):
            if dims in self._seen:
                continue
            self._seen.add(dims)
            if ("forward", dims) in runner._buckets_run:
                continue
            input_ids, positions, md, logits_idx = dummy_batch(*dims[:3])
            packed = pack_step(input_ids, positions, md, None)
            fwd = runner.forward_args(packed, logits_idx)
            key = runner.forward_key(dims, fwd)
            if key in runner.programs or key in self._building:
                continue
            jitted = runner.forward_program(dims)
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="jaxinfer-build-ahead")
            args = (dims, *_abstract(fwd))
            self._building[key] = self._pool.submit(
                lambda jitted=jitted, args=args: jitted.lower(*args).compile())

    def take(self, key):
        """The program built ahead for ``key`` (waiting for its build), or
        None when none was started or its build failed (the caller builds
        it as usual)."""
        future = self._building.pop(key, None)
        if future is None:
            return None
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - the step builds it itself
            logger.warning("building a decode program ahead failed; building "
                           "it on first use instead", exc_info=True)
            return None

    def pending(self) -> int:
        """Builds started and not yet taken."""
        return len(self._building)
