"""`StepPrograms`: every compiled program a step runs, and what picks it.

One owner for the JAX side of a step: the buckets a step is padded to, the
program keys (`program_keys.py`), the jitted functions
(`step_functions.py`), the compiled programs built ahead of their first
step (warm-up, `warmup.py`; background builds, `build_ahead.py`), the
saved executables (`executable_cache.py`) and the CPU compiler options
(`compile_options.py`). The runner lays a step out as host arrays
(`StepInputs`) and calls `run`; the engine asks `will_build` before a
step, to return the tokens in flight rather than hold them behind a build.

The set of programs is bounded and known at start: nothing a request sends
picks a width (`sampler_widths`), so `wanted` lists every program a step
can run (each bucket's forward, its LoRA, image and prompt-logprob
variants, the decode windows, both sampler tiers at every width, the
prompt-logprob and penalty-counting programs) and warm-up builds them all;
`built` holds those built so far, whatever built them. Without warm-up jit
builds them on first use, still within that set: a key outside it is a
layout bug, logged and counted (`num_outside`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..config import CacheConfig, SchedulerConfig
from ..core.kv_cache_manager import cdiv
from ..core.scheduler_output import SchedulerOutput
from ..spec_decode.verify import AcceptRule, accept_matching, verify_step
from . import warmup
from .buckets import Bucket, Buckets
from .build_ahead import BuildAhead, abstract
from .compile_options import DECODE_OPTIONS_ROWS, PREFILL_OPTIONS_MAX_TOKENS, decode_compile_options
from .executable_cache import executable_cache_for, programs_fingerprint
from .program_keys import (
    COUNT,
    PROMPT_LOGPROBS,
    VERIFY,
    WINDOW,
    AuxKey,
    ForwardKey,
    ModelProgram,
    ProgramBuild,
    ProgramKey,
    SampleKey,
    WindowKey,
)
from .sampler import SamplingMetadata
from .sampling_inputs import SamplingInputs
from .step_functions import count_penalty_tokens, forward, multi_step, prompt_logprobs, sample_step

logger = logging.getLogger(__name__)

# Attention backends whose cost does not grow with the block table's width
# (the kernels stop at each sequence's length): one P bucket, fewer programs.
FIXED_PAGE_BACKENDS = ("pallas", "pallas_triton", "pallas_xla_rope")
# CPU decode steps of one sequence get their own one-row programs only for
# models whose rows cost something: for a test-sized model the extra
# programs' compiles cost more than the one-row steps save.
SMALL_DECODE_MIN_PARAMS = 10_000_000
# A first request's programs are built while the weights load
# (`can_build_first`) for models of at least this size: under it (the test
# suite's tiny models) the weights load too quickly to hide a build, and a
# guess that misses would only take CPU from the steps' own builds.
BUILD_FIRST_MIN_PARAMS = SMALL_DECODE_MIN_PARAMS


@dataclasses.dataclass
class DeviceState:
    """What the model programs read besides a step's own inputs: the
    runner's device arrays (or, before the weights load, their
    ShapeDtypeStructs)."""
    params: Any
    kv_pages: Any  # list of L page tuples (pallas_kernels/kv_cache.py)
    constants: dict  # the model's tables (models.runtime.model_constants)
    prev_tokens: Any  # [max_num_seqs] int32: the last step's tokens


@dataclasses.dataclass
class StepInputs:
    """One step's inputs on the host, laid out in its bucket's shapes."""
    bucket: Bucket
    # ids, positions, attention metadata (packing.py); a device array once
    # a draft model's drafts are written in (spec_decode/draft_model.py)
    packed: np.ndarray | jax.Array
    sampling: SamplingMetadata
    logits_indices: Any = None  # [S + Tp]: sampled rows, then prompt rows
    num_logprobs: int | None = None  # top-K logprobs to return
    prompt_lp_targets: Any = None  # [T] prompt tokens to score
    encoder: tuple | None = None  # (encoder cache, mm_index [T]) for images
    lora_pool: Any = None  # the adapter slots, when a row uses one
    num_steps: int = 1  # > 1: a window of decode steps
    stop_ids: Any = None  # [S, WINDOW_STOP_IDS] for "while" windows
    # Speculative steps: [S, k] each row's drafts and [S] how many are real.
    drafts: Any = None
    num_drafts: Any = None
    # [S] each row's drafts rejected by the step before, when this step was
    # laid out before they were known (spec_decode/overlap.py); else zeros
    shift: Any = None
    # Penalty counting before the sampler (sampling_inputs.CountChunk).
    count_chunks: list = dataclasses.field(default_factory=list)
    # Writes the constrained rows' masks into sampling.token_bitmask (host
    # memory) once the forward program is enqueued, before the sampler is.
    fill_token_masks: Callable[[np.ndarray], None] | None = None


class StepOutputs(NamedTuple):
    """What a step's programs return, still on the device."""
    # SamplerOutput (token_ids [S], or [num_steps, S]), or VerifiedOutput
    sampled: Any
    prompt_logprobs: Any  # None unless prompt logprobs were asked for
    kv_pages: Any
    penalty_state: Any  # None unless the step applied penalties
    next_tokens: Any  # [max_num_seqs] the tokens the next step may read
    # [T, D * taps] the step's hidden states at an EAGLE head's taps; None
    # without a head (or for a window of decode steps)
    hidden: Any = None


class StepPrograms:
    def __init__(self, model, placement, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, sampling_inputs: SamplingInputs,
                 lora_config=None, on_cpu: bool = False,
                 max_logprobs: int = 20, num_speculative_tokens: int = 0,
                 hidden_taps: tuple | None = None):
        self.model = model
        self.cfg = model.cfg
        self.placement = placement
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.block_size = cache_config.block_size
        self.sampling_inputs = sampling_inputs
        self.lora_config = lora_config
        self.on_cpu = on_cpu
        # The full sampler tier returns this many top logprobs (rows that
        # asked for fewer are cut on the host): one static value.
        self.max_logprobs = max_logprobs
        # k > 0: every step scores k + 1 rows per sequence and samples
        # with the verifying sampler (spec_decode/verify.py).
        self.num_speculative_tokens = num_speculative_tokens
        # An EAGLE head's taps: the forward programs also return the
        # target's hidden states there (step_functions.forward); None: not.
        self.hidden_taps = hidden_taps
        self.buckets = Buckets.make(
            scheduler_config.max_num_batched_tokens,
            scheduler_config.max_num_seqs,
            cdiv(scheduler_config.max_model_len, self.block_size),
            fixed_pages=model.backend in FIXED_PAGE_BACKENDS,
            small_decode=(on_cpu and
                          self.cfg.num_params >= SMALL_DECODE_MIN_PARAMS),
            verify_width=(num_speculative_tokens + 1
                          if num_speculative_tokens else 0))
        # A step is two programs: the forward pass, one per bucket whatever
        # the batch's sampling needs, and the sampler, one per sampling
        # variant and S. The logits between them are pinned replicated, so
        # the sampler's programs, compiled ahead from their shapes, take
        # them as they come.
        step_forward = functools.partial(
            forward, placement.step_model(model),
            logits_sharding=placement.replicated,
            rows_per_seq=num_speculative_tokens + 1, taps=hidden_taps)
        self._forward = jax.jit(step_forward, static_argnums=(0,),
                                donate_argnums=(2,))
        # Few-row buckets on CPU compile with their own XLA options.
        self.decode_options = decode_compile_options(on_cpu)
        self._forward_few_rows = None if not self.decode_options else jax.jit(
            step_forward, static_argnums=(0,), donate_argnums=(2,),
            compiler_options=self.decode_options)
        # A speculative engine's decode-only steps in which no row drafts
        # score one row per sequence and sample with the plain sampler: the
        # verifying sampler would score k + 1 rows for each, all padding,
        # and cost k + 1 times a plain step's sampling for nothing.
        self._forward_one_row = self._forward_one_row_few = None
        if num_speculative_tokens:
            one_row = functools.partial(
                forward, placement.step_model(model),
                logits_sharding=placement.replicated, rows_per_seq=1,
                taps=hidden_taps)
            self._forward_one_row = jax.jit(one_row, static_argnums=(0,),
                                            donate_argnums=(2,))
            if self.decode_options:
                self._forward_one_row_few = jax.jit(
                    one_row, static_argnums=(0,), donate_argnums=(2,),
                    compiler_options=self.decode_options)
        self.sample_program = jax.jit(sample_step, static_argnums=(0,),
                                      donate_argnums=(2,))
        self.use_acceptance_rule(accept_matching)
        self.prompt_lp_program = jax.jit(prompt_logprobs, static_argnums=(0,))
        self.count_program = jax.jit(count_penalty_tokens, donate_argnums=(0,))
        # Compiled programs built ahead of their first step (warm-up, build
        # ahead, saved executables); other steps run through jit's cache.
        self.built: dict[ProgramKey, Any] = {}
        self.num_loaded = 0  # of `built`, read from the executable cache
        # Model programs steps have run, whether built ahead or by jit:
        # `will_build` is False for them.
        self._models_run: set[ModelProgram] = set()
        # Every key a step has run, and those outside `known_keys`.
        self.keys_run: set[ProgramKey] = set()
        self.num_outside = 0
        self._known: set[ProgramKey] | None = None
        self._enumerate_from: tuple | None = None  # (state, pool, cache) structs
        self.build_ahead = BuildAhead(self)
        # "scan": a "while" window reads its condition back to the host
        # every step on a GPU.
        self.use_window_loop("scan")

    # -- which program a step runs -----------------------------------------

    def bucket(self, out: SchedulerOutput) -> Bucket:
        """The bucket a scheduled step is padded to."""
        sched = out.scheduled
        lens = [len(s.token_ids) for s in sched]
        return self.buckets.bucket(sum(lens), len(sched),
                                   max(len(s.block_table) for s in sched),
                                   all(s.sample for s in sched), max(lens))

    def will_build(self, out: SchedulerOutput) -> bool:
        """Whether running ``out`` would first build its bucket's model
        program (trace it, then compile it or read it from the compilation
        cache): none was built ahead for that bucket and no step has run
        in it. (A new sampling variant's program is small: not counted.)"""
        if not out.scheduled:
            return False
        program = ModelProgram(out.num_steps, self.bucket(out))
        return program not in self._models_run and not any(
            key.model_program == program for key in self.built)

    def has_run(self, program: ModelProgram) -> bool:
        return program in self._models_run

    @property
    def models_run(self) -> frozenset[ModelProgram]:
        """Every model program a step has run in."""
        return frozenset(self._models_run)

    def forward_program(self, bucket: Bucket, one_row: bool = False):
        """The jitted forward of a bucket: few-row buckets (decode-only ones
        of DECODE_OPTIONS_ROWS sequences, prefill ones of at most
        PREFILL_OPTIONS_MAX_TOKENS tokens) have their own compiler options
        on CPU (`decode_options`). ``one_row``: a speculative engine's
        draftless decode-only step (one scored row per sequence)."""
        plain, few = self._forward, self._forward_few_rows
        if one_row and self._forward_one_row is not None:
            plain, few = self._forward_one_row, self._forward_one_row_few
        if few is None:
            return plain
        lo, hi = DECODE_OPTIONS_ROWS
        if (lo <= bucket.seqs <= hi if bucket.decode_only
                else bucket.tokens <= PREFILL_OPTIONS_MAX_TOKENS):
            return few
        return plain

    def use_window_loop(self, loop: str) -> None:
        """How decode windows loop (`step_functions.WINDOW_LOOPS`); drops
        the window programs built so far."""
        self.window_loop = loop
        self.window_program = jax.jit(functools.partial(
            multi_step, self.placement.step_model(self.model), self.block_size,
            loop=loop), static_argnums=(0, 1), donate_argnums=(3,))
        self.built = {k: v for k, v in self.built.items() if k.kind != WINDOW}
        self._known = None  # the window keys changed

    def use_acceptance_rule(self, rule: AcceptRule) -> None:
        """The rule the verifying sampler accepts drafts by (tests replace
        it to check that a wrong rule is caught); drops the verify programs
        built so far."""
        self.verify_program = jax.jit(functools.partial(verify_step, rule),
                                      static_argnums=(0,), donate_argnums=(2,))
        self.built = {k: v for k, v in getattr(self, "built", {}).items()
                      if k.kind != VERIFY}

    # -- program arguments and keys ----------------------------------------

    @staticmethod
    def forward_args(state: DeviceState, packed, logits_indices, encoder=None,
                     lora_pool=None) -> tuple:
        """The forward program's dynamic arguments, in order."""
        return (state.params, state.kv_pages, state.constants,
                state.prev_tokens, packed, logits_indices, encoder, lora_pool)

    @staticmethod
    def forward_key(bucket: Bucket, args: tuple) -> ForwardKey:
        return ForwardKey.of(bucket, args[4:7], args[7] is not None)

    @staticmethod
    def sample_args(logits, penalty_state, prev_tokens, sampling) -> tuple:
        """The sampler program's dynamic arguments, in order (``logits``:
        the forward program's sampled rows, or `logits_struct` when built
        ahead)."""
        return (logits, penalty_state, prev_tokens, sampling)

    @staticmethod
    def sample_key(num_logprobs, args: tuple) -> SampleKey:
        if len(args) > 4:  # the verifying sampler's drafts follow
            return SampleKey.of(num_logprobs, args[:2] + args[3:], VERIFY)
        return SampleKey.of(num_logprobs, args[:2] + args[3:4])

    @property
    def sampled_rows_per_seq(self) -> int:
        """Logits rows each sequence hands the sampler."""
        return self.num_speculative_tokens + 1

    @staticmethod
    def prompt_lp_key(num_logprobs, args: tuple) -> AuxKey:
        """``args``: (prompt logits [T, V], targets [T])."""
        return AuxKey.of(PROMPT_LOGPROBS, (num_logprobs,), args)

    @staticmethod
    def count_key(args: tuple) -> AuxKey:
        """``args``: (penalty state, resets, ids, slots, is_output)."""
        return AuxKey.of(COUNT, (), args)

    def logits_struct(self, rows: int) -> jax.ShapeDtypeStruct:
        """What the forward program hands the sampler: [rows, V] float32,
        replicated."""
        return jax.ShapeDtypeStruct((rows, self.cfg.vocab_size), jnp.float32,
                                    sharding=self.placement.replicated)

    @staticmethod
    def window_args(state: DeviceState, packed, sampling, stop_ids,
                    lora_pool=None) -> tuple:
        """The window program's dynamic arguments, in order."""
        return (state.params, state.kv_pages, state.constants,
                state.prev_tokens, packed, sampling, stop_ids, lora_pool)

    @staticmethod
    def window_key(num_steps: int, bucket: Bucket, args: tuple) -> WindowKey:
        return WindowKey.of(num_steps, bucket, args[4:7], args[7] is not None)

    # -- running a step -----------------------------------------------------

    def run(self, state: DeviceState, inputs: StepInputs,
            penalty_state=None) -> StepOutputs:
        """Enqueues a step's programs (each built ahead when one was, else
        by jit's own cache on first use) and returns without waiting."""
        bucket = inputs.bucket
        self._models_run.add(ModelProgram(inputs.num_steps, bucket))
        if inputs.num_steps > 1:
            args = self.window_args(state, inputs.packed, inputs.sampling,
                                    inputs.stop_ids, inputs.lora_pool)
            key = self.window_key(inputs.num_steps, bucket, args)
            sampled, kv_pages, next_tokens = self._call(
                self.window_program, key, (inputs.num_steps, bucket), args)
            return StepOutputs(sampled, None, kv_pages, None, next_tokens)
        for chunk in inputs.count_chunks:
            args = (penalty_state, chunk.reset_slots, chunk.count_ids,
                    chunk.count_slots, chunk.count_is_output)
            penalty_state = self._call(self.count_program,
                                       self.count_key(args), (), args)
        args = self.forward_args(state, inputs.packed, inputs.logits_indices,
                                 inputs.encoder, inputs.lora_pool)
        verifying = bool(self.num_speculative_tokens) and inputs.drafts is not None
        logits, prompt_logits, kv_pages, *hidden = self._call(
            self.forward_program(bucket, one_row=not verifying),
            self.forward_key(bucket, args), (bucket,), args)
        bitmask = inputs.sampling.token_bitmask
        if isinstance(bitmask, np.ndarray) and inputs.fill_token_masks is not None:
            inputs.fill_token_masks(bitmask)  # the device runs the forward pass
        args = self.sample_args(logits, penalty_state, state.prev_tokens,
                                inputs.sampling)
        program = self.sample_program
        if verifying:
            args += (inputs.drafts, inputs.num_drafts, inputs.shift)
            program = self.verify_program
        sampled, penalty_state, next_tokens = self._call(
            program, self.sample_key(inputs.num_logprobs, args),
            (inputs.num_logprobs,), args)
        prompt_lp = None
        if inputs.prompt_lp_targets is not None:
            num_lp = self.max_logprobs
            args = (prompt_logits, inputs.prompt_lp_targets)
            prompt_lp = self._call(self.prompt_lp_program,
                                   self.prompt_lp_key(num_lp, args),
                                   (num_lp,), args)
        return StepOutputs(sampled, prompt_lp, kv_pages, penalty_state,
                           next_tokens, hidden[0] if hidden else None)

    # -- the set of programs ------------------------------------------------

    def enumerate_from(self, state: DeviceState, lora_pool=None,
                       encoder_cache=None) -> None:
        """Sets what `known_keys` enumerates over (shapes only are kept)."""
        self._enumerate_from = abstract((state, lora_pool, encoder_cache))
        self._known = None

    def known_keys(self) -> set[ProgramKey] | None:
        """Every program a step can run (`wanted`'s keys); None before
        `enumerate_from`."""
        if self._known is None and self._enumerate_from is not None:
            try:
                self._known = set(self.wanted(*self._enumerate_from))
            except Exception:  # the check must not stop a step
                logger.exception("could not enumerate the step programs; "
                                 "steps run unchecked")
                self._enumerate_from = None
        return self._known

    @property
    def num_programs(self) -> int:
        """Programs built or run so far (warm-up's and jit's)."""
        return len(self.keys_run.union(self.built))

    def _call(self, jitted, key: ProgramKey, static: tuple, args: tuple):
        if key not in self.keys_run:
            self.keys_run.add(key)
            known = self.known_keys()
            if known is not None and key not in known:
                self.num_outside += 1
                logger.error("a step runs a program outside the enumerated "
                             "set (a layout that escapes its widths): %r",
                             key)
        program = self.built.get(key)
        if program is None:
            program = self.build_ahead.take(key)
            if program is not None:
                self.built[key] = program
        if program is not None:
            return program(*args)
        return jitted(*static, *args)

    # -- building ahead -----------------------------------------------------

    def can_build_first(self) -> bool:
        """Whether a first request's programs can be built before the
        weights load: on CPU, where the page pool's size does not follow
        the memory the weights take, with one process and one pipeline
        stage, for an unquantized text-only model without LoRA of at least
        BUILD_FIRST_MIN_PARAMS (quantized params have their own layouts,
        which `Placement.param_structs` does not foresee)."""
        return (self.on_cpu and jax.process_count() == 1
                and self.cfg.num_params >= BUILD_FIRST_MIN_PARAMS
                and self.cfg.quantization is None
                and self.lora_config is None
                and self.placement.pipeline_stages == 1
                and self.cfg.image_input is None
                and self.scheduler_config.num_scheduler_steps == 1
                and not self.num_speculative_tokens)

    def wanted(self, state: DeviceState, lora_pool=None,
               encoder_cache=None) -> dict[ProgramKey, ProgramBuild]:
        """Every program a step can run, which warm-up builds
        (`warmup.wanted_programs`), by key: a set bounded by the buckets
        and the fixed sampler widths, known at start."""
        return warmup.wanted_programs(self, state, lora_pool, encoder_cache)

    def warm_up(self, state: DeviceState, compilation_cache_dir: str | None,
                lora_pool=None, encoder_cache=None) -> tuple[int, int, float]:
        """Builds every program of `wanted` that is not built, loading
        those the executable cache holds. Returns (compiled, loaded,
        seconds)."""
        t0 = time.perf_counter()
        executables = executable_cache_for(
            lambda: programs_fingerprint(self, state), compilation_cache_dir)
        todo = {key: build for key, build in
                self.wanted(state, lora_pool, encoder_cache).items()
                if key not in self.built}
        compiled, loaded = warmup.build_all(todo, self.built, executables,
                                            progress=warmup.interactive())
        self.num_loaded = loaded
        self.build_ahead.stop()  # every bucket's program is built
        return compiled, loaded, time.perf_counter() - t0
