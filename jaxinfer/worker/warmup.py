"""Compile-ahead: the persistent XLA compilation cache and warm-up.

Warm-up runs the step once at every reachable (T, S, P) bucket (and its
decode-only variant where one token per sequence can land there), for greedy,
sampled and filtered (top-k / top-p / min-p) batches, so that serving never
waits on a compile; with the persistent cache the second start of the same model loads those programs
from disk instead of compiling them.
"""

from __future__ import annotations

import logging
import os
import time

import jax
import numpy as np

from jaxinfer.models import AttentionMetadata

from ..core.scheduler_output import ScheduledRequest
from ..request import Request
from ..sampling_params import SamplingParams
from .packing import pack_step

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "jaxinfer",
                                 "xla")


def enable_compilation_cache(cache_dir: str | None) -> str | None:
    """Points JAX's persistent compilation cache at ``cache_dir`` (created if
    needed). None: ``$JAXINFER_COMPILATION_CACHE_DIR`` if set, else
    ``~/.cache/jaxinfer/xla``, on every platform: on a laptop CPU the
    compiles of a first ``generate`` take longer than the rest of the run,
    so the second run loads them instead. An empty string (argument or
    variable) turns the cache off. Returns the directory in use."""
    if cache_dir is None:
        cache_dir = os.environ.get("JAXINFER_COMPILATION_CACHE_DIR",
                                   DEFAULT_CACHE_DIR)
    if not cache_dir:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current and current != cache_dir:
        logger.warning("the compilation cache is already at %s; keeping it "
                       "(JAX allows one per process)", current)
        return current
    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    # Cache every program, however quick: the point is a fast second start.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return cache_dir


def _prev(ladder, v):
    i = ladder.index(v)
    return ladder[i - 1] if i else 0


def reachable_shapes(buckets, block_size: int):
    """The (T, S, P) buckets a real step can land in: some token count in
    T's range fits S sequences of at most P pages each."""
    out = []
    for t, s, p in buckets.all_shapes():
        n_tok = max(_prev(buckets.tokens, t) + 1, _prev(buckets.seqs, s) + 1)
        if n_tok <= t and n_tok <= s * p * block_size:
            out.append((t, s, p))
    return out


def decode_only_reachable(buckets, shape) -> bool:
    """Whether a step of one token per sequence lands in bucket (T, S, P):
    some sequence count falls in both T's and S's range."""
    t, s, _ = shape
    return max(_prev(buckets.tokens, t), _prev(buckets.seqs, s)) < min(t, s)


def _dummy_batch(T: int, S: int, P: int):
    """A batch of the given bucket shape: one 1-token sequence on the null
    page, the rest padding (the step writes only the null page)."""
    cu = np.ones(S + 1, np.int32)
    cu[0] = 0
    kv_lens = np.zeros(S, np.int32)
    kv_lens[0] = 1
    md = AttentionMetadata(np.zeros(T, np.int32), np.zeros((S, P), np.int32),
                           kv_lens, cu, np.array([1], np.int32))
    return np.zeros(T, np.int32), np.zeros(T, np.int32), md, \
        np.zeros(S, np.int32)


def warm_up(runner) -> tuple[int, float]:
    """Compiles the step for every reachable bucket (greedy and sampled
    variants) and the page-copy programs. Returns (programs, seconds)."""
    t0 = time.perf_counter()
    shapes = reachable_shapes(runner.buckets, runner.block_size)
    # Greedy, plain sampling, and sampling with top-k / top-p / min-p (one
    # variant: sampling_inputs sends the three filters together).
    variants = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
                SamplingParams(temperature=1.0, top_p=0.9)]
    sched = [ScheduledRequest("warmup", [0], 0, [0], True)]
    n = n_decode_only = 0
    for T, S, P in shapes:
        input_ids, positions, md, logits_idx = _dummy_batch(T, S, P)
        packed = pack_step(input_ids, positions, md)
        # The dummy batch (one 1-token sequence) is valid for both attention
        # variants: the general one, and the decode-only one where it can
        # occur.
        flags = [False]
        if decode_only_reachable(runner.buckets, (T, S, P)):
            flags.append(True)
            n_decode_only += 1
        for sp in variants:
            smd = runner.sampling_inputs.build(
                sched, {"warmup": Request("warmup", [0], sp)}, S)
            for decode_only in flags:
                _, _, runner.kv_pages, _ = runner._step(
                    None, (T, S, P, decode_only), runner.params,
                    runner.kv_pages, None, runner.cos_sin, packed, logits_idx,
                    smd, None)
                n += 1
    runner.kv_pages, n_copy = runner.page_mover.warm_up(
        runner.kv_pages, runner.scheduler_config.preemption_mode == "swap",
        runner.scheduler_config.max_num_seqs)
    jax.block_until_ready(runner.kv_pages)
    seconds = time.perf_counter() - t0
    logger.info("warm-up compiled %d step programs (%d shape buckets, %d "
                "with a decode-only variant, x %d sampling variants) and %d "
                "page-copy programs in %.1fs", n, len(shapes),
                n_decode_only, len(variants), n_copy, seconds)
    return n + n_copy, seconds
