"""Compile-ahead: the persistent XLA compilation cache and warm-up.

Warm-up compiles the step's forward program for every bucket a step can
land in (`buckets.py` keeps that set small) and its sampler for greedy,
sampled and filtered (top-k / top-p / min-p) batches of each size, so that
serving never waits on a compile;
with the persistent cache the second start of the same model loads those
programs from disk instead of compiling them.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import time

import jax
import numpy as np

from jaxinfer.models import AttentionMetadata

from ..core.scheduler_output import NewRequestData, ScheduledRequest
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


def dummy_batch(T: int, S: int, P: int):
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


def sampling_metadata_for(runner, sp: SamplingParams, S: int):
    """The sampling metadata of an S-row step whose one sampling row asks
    for ``sp``: what selects the sampler's program variant."""
    sched = [ScheduledRequest("warmup", [0], 0, [0], True)]
    return runner.sampling_inputs.build(
        sched, {"warmup": NewRequestData("warmup", [0], 1, sp)}, S)


def _load_saved(executables, keys: list, max_workers: int | None) -> dict:
    """{key: program} for the keys ``executables`` holds, loaded in a
    thread pool (deserializing is C++ work, mostly outside the GIL)."""
    if executables is None or not keys:
        return {}
    workers = max_workers or min(len(keys), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return {key: exe for key, exe in zip(keys, pool.map(executables.load, keys))
                if exe is not None}


def wanted_programs(runner) -> dict:
    """{program key: (jitted, static args, dynamic args)} for every program
    warm-up builds that ``runner.programs`` lacks (see `warm_up`): each
    bucket's forward program (also with the LoRA pool when LoRA is on, and
    in its image variant for models that take images), each decode bucket's
    multi-step window when ``num_scheduler_steps`` > 1, and the sampler's
    programs, greedy, sampled and filtered, for each S a bucket has. The
    forward programs come first: they are nearly all of the build time."""
    shapes = runner.buckets.all_shapes()
    # Greedy, plain sampling, and sampling with top-k / top-p / min-p (one
    # variant: sampling_inputs sends the three filters together).
    variants = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
                SamplingParams(temperature=1.0, top_p=0.9)]
    # With LoRA, each program also in its variant for steps with adapters.
    lora_pools = [None] if runner.lora is None else [None, runner.lora.pool]
    # Multi-step decode: each decode bucket also as a window of k steps.
    k = runner.scheduler_config.num_scheduler_steps
    todo = {}  # program key -> (jitted, static args, dynamic args)

    def want(key, jitted, static, dyn):
        if key not in runner.programs:
            todo.setdefault(key, (jitted, static, dyn))

    for pool, with_mm in itertools.product(lora_pools, (False, True)):
        for T, S, P, decode_only in shapes:
            # A model that takes images also gets each prefill bucket's
            # variant that reads the encoder cache (steps holding image
            # placeholders).
            if with_mm and (runner.encoder is None or decode_only):
                continue
            mm = ((runner.encoder.cache, np.full(T, -1, np.int32))
                  if with_mm else None)
            input_ids, positions, md, logits_idx = dummy_batch(T, S, P)
            dims = (T, S, P, decode_only)
            packed = pack_step(input_ids, positions, md,
                               None if pool is None else np.zeros(T, np.int32))
            fwd = runner.forward_args(packed, logits_idx, mm,
                                      None if pool is None else pool.arrays)
            want(runner.forward_key(dims, fwd), runner.forward_program(dims),
                 (dims,), fwd)
            if decode_only and mm is None and k > 1:  # its decode windows
                for sp in variants:
                    dyn = runner.multi_step_args(
                        packed, sampling_metadata_for(runner, sp, S),
                        runner.window_stop_ids([], S),
                        None if pool is None else pool.arrays)
                    want(runner.multi_step_key(k, dims, dyn), runner._multi,
                         (k, dims), dyn)
    for S in sorted({shape[1] for shape in shapes}):
        for sp in variants:
            smp = runner.sample_args(runner.logits_struct(S), None,
                                     sampling_metadata_for(runner, sp, S), None)
            want(runner.sample_key(None, smp), runner._sample, (None,), smp)
    return todo


def warm_up(runner, max_workers: int | None = None,
            executables=None) -> tuple[int, float]:
    """Compiles the step's programs for every bucket (`Buckets.all_shapes`;
    `wanted_programs` lists them), and the swap programs (and the adapter
    slot writer).
    Tracing and lowering run one program at a time (they hold the GIL);
    each program's XLA compile starts in a thread pool as soon as it is
    lowered, so the compiles run while the next programs lower (on an H200
    host the two took about 88 s and 78 s of a cold llama3-8b warm-up, one
    after the other, before). The executables go to ``runner.programs``,
    where `ModelRunner.run_step` finds them. ``executables``: an
    `ExecutableCache`; programs it holds are loaded instead of lowered and
    compiled, and those compiled are saved into it. Returns (programs,
    seconds)."""
    t0 = time.perf_counter()
    todo = wanted_programs(runner)
    loaded = _load_saved(executables, list(todo), max_workers)
    runner.programs.update(loaded)
    n_loaded = len(loaded)
    # What was not saved (or did not load) is lowered here, one at a time,
    # each compile queued as soon as its program is lowered.
    pending = [key for key in todo if key not in loaded]
    workers = max_workers or min(len(pending), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {}
        for key in pending:
            jitted, static, dyn = todo[key]
            futures[key] = pool.submit(jitted.lower(*static, *dyn).compile)
        t_lower = time.perf_counter() - t0
        for key, future in futures.items():
            runner.programs[key] = future.result()
    if executables is not None:
        for key in futures:
            executables.save(key, runner.programs[key])
    runner.kv_pages, n_copy = runner.page_mover.warm_up(
        runner.kv_pages, runner.scheduler_config.preemption_mode == "swap")
    if runner.encoder is not None:  # one program per image batch size
        n_copy += runner.encoder.warm_up(runner.params)
    if runner.lora is not None:  # the adapter slot writer
        runner.lora.pool.warm_up()
        n_copy += 1
    jax.block_until_ready(runner.kv_pages)
    seconds = time.perf_counter() - t0
    logger.info("warm-up compiled %d step programs and loaded %d saved ones "
                "(lowering done at %.1fs, %d compile threads) and %d copy "
                "and encoder programs in %.1fs", len(futures), n_loaded,
                t_lower, workers, n_copy, seconds)
    runner.programs_loaded = n_loaded
    runner.build_ahead.stop()  # every bucket's program is built
    return len(futures) + n_loaded + n_copy, seconds
