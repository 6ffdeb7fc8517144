"""Compile-ahead: the persistent XLA compilation cache and warm-up.

Warm-up compiles every program a step can run (`wanted_programs`): the
forward program of every bucket a step can land in (`buckets.py` keeps
that set small) in each of its variants, the sampler's plain tier
(greedy, sampled, filtered) and full tier (every bias width of
`sampler_widths`) for each S, and the prompt-logprob and penalty-counting
programs, so that serving never waits on a compile; with the persistent cache the second
start of the same model loads those programs from disk instead of
compiling them. Each program is built from a dummy batch of its bucket's
shapes (`forward_build`, `sample_build`, `window_build`), which
`build_ahead.py` uses too.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING, cast

import jax
import numpy as np

from jaxinfer.models import AttentionMetadata

from ..core.scheduler_output import NewRequestData, ScheduledRequest
from ..sampling_params import SamplingParams
from .buckets import Bucket
from .packing import pack_step
from .penalties import PenaltyState
from .program_keys import ProgramBuild, ProgramKey
from .sampler_widths import bias_widths
from .sampling_inputs import SamplingInputs, prompt_logprob_rows
from .step_functions import window_stop_ids

if TYPE_CHECKING:
    from .step_programs import DeviceState, StepPrograms

logger = logging.getLogger(__name__)

# The persistent compilation cache's cap: JAX evicts the least recently
# used entries past it.
COMPILATION_CACHE_MAX_BYTES = 16 << 30
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
    # jax's Config declares its options as dynamic attributes.
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current and current != cache_dir:
        logger.warning("the compilation cache is already at %s; keeping it "
                       "(JAX allows one per process)", current)
        return current
    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    # Cache every program, however quick: the point is a fast second start.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # Bounded: JAX deletes the least recently used entries past the cap
    # (a size set through JAX's own option or variable is kept).
    if jax.config.jax_compilation_cache_max_size == -1:  # type: ignore[attr-defined]
        jax.config.update("jax_compilation_cache_max_size",
                          COMPILATION_CACHE_MAX_BYTES)
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


def sampling_metadata_for(sampling_inputs, sp: SamplingParams, S: int):
    """The sampling metadata of an S-row step whose one sampling row asks
    for ``sp``: what selects the sampler's program variant (built by a
    copy of ``sampling_inputs``, whose penalty slots it leaves alone)."""
    sched = [ScheduledRequest("warmup", [0], 0, [0], True)]
    inputs = SamplingInputs(sampling_inputs.vocab,
                            sampling_inputs.max_num_seqs, 0,
                            sampling_inputs.count_width)
    return inputs.build(
        sched, {"warmup": NewRequestData("warmup", [0], 1, sp)}, S)


# The plain tier: greedy, plain sampling, and sampling with top-k / top-p /
# min-p (one variant: sampling_inputs sends the three filters together).
SAMPLING_VARIANTS = (SamplingParams(temperature=0.0),
                     SamplingParams(temperature=1.0),
                     SamplingParams(temperature=1.0, top_p=0.9))


def full_tier_params(bias_width: int) -> SamplingParams:
    """A request whose step takes the full sampler tier at ``bias_width``."""
    return SamplingParams(temperature=1.0, presence_penalty=0.5,
                          logit_bias=dict.fromkeys(range(bias_width), 1.0))


def penalty_state_struct(programs: StepPrograms) -> PenaltyState:
    """The penalty state's layout (the runner makes it in this sharding)."""
    rows = programs.sampling_inputs.slots.rows
    V = programs.cfg.vocab_size
    sharding = programs.placement.replicated  # as the logits it meets
    # Lowering reads only shapes: the state's fields hold structs here.
    return PenaltyState(
        cast(jax.Array, jax.ShapeDtypeStruct((rows, V), np.int32,
                                             sharding=sharding)),
        cast(jax.Array, jax.ShapeDtypeStruct((rows, V), np.bool_,
                                             sharding=sharding)))


def forward_build(programs: StepPrograms, bucket: Bucket, state: DeviceState,
                  lora_pool=None, encoder_cache=None, prompt_lp: bool = False,
                  one_row: bool = False):
    """(key, ProgramBuild) of a bucket's forward program, over a dummy
    batch; with the LoRA pool's and the encoder cache's variants when
    given, with T more logits rows for prompt logprobs when ``prompt_lp``,
    and scoring one row per sequence when ``one_row`` (a speculative
    engine's draftless decode-only step)."""
    T, S, P = bucket[:3]
    input_ids, positions, md, _ = dummy_batch(T, S, P)
    rows = S * (1 if one_row else programs.sampled_rows_per_seq)
    lp_rows = prompt_logprob_rows(T, programs.scheduler_config)
    logits_idx = np.zeros(rows + lp_rows if prompt_lp else rows, np.int32)
    packed = pack_step(input_ids, positions, md,
                       None if lora_pool is None else np.zeros(T, np.int32))
    encoder = (None if encoder_cache is None
               else (encoder_cache, np.full(T, -1, np.int32)))
    args = programs.forward_args(state, packed, logits_idx, encoder, lora_pool)
    return programs.forward_key(bucket, args), ProgramBuild(
        programs.forward_program(bucket, one_row), (bucket,), args)


def sample_build(programs: StepPrograms, S: int, sp: SamplingParams,
                 prev_tokens, plain: bool = False):
    """(key, ProgramBuild) of the sampler of S rows for ``sp``'s tier and
    variant (the full tier with the penalty state and top logprobs); a
    speculative engine's verifying sampler unless ``plain``."""
    md = sampling_metadata_for(programs.sampling_inputs, sp, S)
    full = md.penalties is not None
    num_lp = programs.max_logprobs if full else None
    k = 0 if plain else programs.num_speculative_tokens
    args = programs.sample_args(
        programs.logits_struct(S * (k + 1)),
        penalty_state_struct(programs) if full else None, prev_tokens, md)
    program = programs.sample_program
    if k:  # the verifying sampler, with each row's drafts
        args += (np.zeros((S, k), np.int32), np.zeros(S, np.int32),
                 np.zeros(S, np.int32))
        program = programs.verify_program
    return programs.sample_key(num_lp, args), ProgramBuild(
        program, (num_lp,), args)


def prompt_lp_build(programs: StepPrograms, T: int):
    """(key, ProgramBuild) of prompt logprobs over T rows (a bucket's
    `prompt_logprob_rows`)."""
    num_lp = programs.max_logprobs
    args = (programs.logits_struct(T), np.zeros(T, np.int32))
    return programs.prompt_lp_key(num_lp, args), ProgramBuild(
        programs.prompt_lp_program, (num_lp,), args)


def count_build(programs: StepPrograms):
    """(key, ProgramBuild) of the penalty counting of fresh slots."""
    si = programs.sampling_inputs
    C = si.count_width
    args = (penalty_state_struct(programs),
            np.zeros(si.max_num_seqs, np.int32), np.zeros(C, np.int32),
            np.zeros(C, np.int32), np.zeros(C, np.bool_))
    return programs.count_key(args), ProgramBuild(programs.count_program, (),
                                                  args)


def window_build(programs: StepPrograms, num_steps: int, bucket: Bucket,
                 state: DeviceState, sp: SamplingParams, lora_pool=None):
    """(key, ProgramBuild) of a decode bucket's window of ``num_steps``."""
    T, S, P = bucket[:3]
    input_ids, positions, md, _ = dummy_batch(T, S, P)
    packed = pack_step(input_ids, positions, md,
                       None if lora_pool is None else np.zeros(T, np.int32))
    args = programs.window_args(
        state, packed, sampling_metadata_for(programs.sampling_inputs, sp, S),
        window_stop_ids([], S, programs.window_loop), lora_pool)
    return programs.window_key(num_steps, bucket, args), ProgramBuild(
        programs.window_program, (num_steps, bucket), args)


def wanted_programs(programs: StepPrograms, state: DeviceState,
                    lora_pool=None, encoder_cache=None
                    ) -> dict[ProgramKey, ProgramBuild]:
    """Every program a step can run, by key: each bucket's forward program
    (also with the LoRA pool when given, in its image variant when an
    encoder cache is given, and with prompt-logprob rows), each decode
    bucket's window when ``num_scheduler_steps`` > 1, the sampler's plain
    tier (greedy, sampled, filtered) and full tier (each bias width) for
    each S a bucket has, prompt logprobs for each T, and the penalty
    counting; under speculative decoding the verifying sampler takes the
    plain one's place, and each decode-only bucket also gets the forward
    pass and samplers of a draftless step. The forward programs come
    first: they are nearly all of the build time."""
    shapes = programs.buckets.all_shapes()
    k = programs.scheduler_config.num_scheduler_steps
    todo: dict[ProgramKey, ProgramBuild] = {}
    for pool, with_mm, prompt_lp in itertools.product(
            [None] if lora_pool is None else [None, lora_pool], (False, True),
            (False, True)):
        for bucket in shapes:
            # A model that takes images also gets each prefill bucket's
            # variant that reads the encoder cache (steps holding image
            # placeholders).
            if with_mm and (encoder_cache is None or bucket.decode_only):
                continue
            if prompt_lp and bucket.decode_only:  # see Buckets.bucket
                continue
            key, build = forward_build(programs, bucket, state, pool,
                                       encoder_cache if with_mm else None,
                                       prompt_lp)
            todo.setdefault(key, build)
            if (programs.num_speculative_tokens and bucket.decode_only
                    and not with_mm and not prompt_lp):
                key, build = forward_build(programs, bucket, state, pool,
                                           one_row=True)
                todo.setdefault(key, build)
            if bucket.decode_only and not with_mm and not prompt_lp and k > 1:
                for sp in SAMPLING_VARIANTS:
                    key, build = window_build(programs, k, bucket, state, sp,
                                              pool)
                    todo.setdefault(key, build)
    full = [full_tier_params(w)
            for w in bias_widths(programs.cfg.vocab_size)]
    for S in sorted({bucket.seqs for bucket in shapes}):
        for sp in (*SAMPLING_VARIANTS, *full):
            key, build = sample_build(programs, S, sp, state.prev_tokens)
            todo.setdefault(key, build)
    if programs.num_speculative_tokens:  # draftless decode-only steps
        for S in sorted({b.seqs for b in shapes if b.decode_only}):
            for sp in (*SAMPLING_VARIANTS, *full):
                key, build = sample_build(programs, S, sp, state.prev_tokens,
                                          plain=True)
                todo.setdefault(key, build)
    for T in sorted({prompt_logprob_rows(bucket.tokens,
                                         programs.scheduler_config)
                     for bucket in shapes}):
        key, build = prompt_lp_build(programs, T)
        todo.setdefault(key, build)
    key, build = count_build(programs)
    todo.setdefault(key, build)
    return todo


def _load_saved(executables, keys: list, max_workers: int | None) -> dict:
    """{key: program} for the keys ``executables`` holds, loaded in a
    thread pool (deserializing is C++ work, mostly outside the GIL)."""
    if executables is None or not keys:
        return {}
    workers = max_workers or min(len(keys), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return {key: exe for key, exe in zip(keys, pool.map(executables.load, keys))
                if exe is not None}


def interactive() -> bool:
    """Whether someone watches: a terminal on stderr, or a notebook."""
    import sys
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def build_all(todo: dict[ProgramKey, ProgramBuild], built: dict,
              executables=None, max_workers: int | None = None,
              progress: bool = False) -> tuple[int, int]:
    """Builds every program of ``todo`` into ``built``. Programs the
    executable cache holds are loaded instead; the rest are traced and
    lowered one at a time (that holds the GIL) and each one's XLA compile
    starts in a thread pool as soon as it is lowered, so the compiles run
    while the next programs lower. Those compiled are saved into the
    cache. ``progress``: a progress bar (tqdm) counts the programs built.
    Returns (compiled, loaded)."""
    t0 = time.perf_counter()
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(todo), desc="Compiling step programs",
                   unit="program", dynamic_ncols=True)
    loaded = _load_saved(executables, list(todo), max_workers)
    built.update(loaded)
    if bar is not None:
        bar.update(len(loaded))
    pending = [key for key in todo if key not in loaded]
    workers = max_workers or min(len(pending), os.cpu_count() or 1) or 1
    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = {}
            for key in pending:
                jitted, static, args = todo[key]
                futures[key] = pool.submit(jitted.lower(*static, *args).compile)
                if bar is not None:
                    futures[key].add_done_callback(lambda _: bar.update())
            t_lower = time.perf_counter() - t0
            for key, future in futures.items():
                built[key] = future.result()
    finally:
        if bar is not None:
            bar.close()
    if executables is not None:
        for key in futures:
            executables.save(key, built[key])
    logger.info("warm-up compiled %d step programs and loaded %d saved ones "
                "(lowering done at %.1fs, %d compile threads) in %.1fs",
                len(futures), len(loaded), t_lower, workers,
                time.perf_counter() - t0)
    return len(futures), len(loaded)
