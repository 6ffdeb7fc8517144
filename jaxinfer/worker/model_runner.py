"""`ModelRunner`: SchedulerOutput -> padded arrays -> one jitted step
(the programs themselves: `step_programs.py`).

The only place that builds device arrays. Each step packs its metadata into
NumPy arrays padded to the step's bucket, transfers them once, and runs
``step(params, kv_pages, ...)`` with the page pool donated (updated in place).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models import (ModelFiles, load_params, model_class,
                             resolve_backend)
from jaxinfer.models.runtime import model_constants
from jaxinfer.models.dummy import random_params
from jaxinfer.models.orbax_checkpoint import restore_params
from jaxinfer.models.quantization.methods import with_int4_kernel

from ..config import CacheConfig, SchedulerConfig
from ..core.encoder_cache_manager import encoder_cache_slots
from ..core.kv_cache_manager import cdiv
from ..core.scheduler_output import NewRequestData, SchedulerOutput
from .buckets import Buckets
from .build_ahead import BuildAhead
from .compile_options import (DECODE_OPTIONS_ROWS, PREFILL_OPTIONS_MAX_TOKENS,
                              decode_compile_options)
from .encoder_runner import EncoderRunner
from .kv_dtype import kv_page_dtype, page_bytes
from .kv_pool_size import num_kv_pages, pages_per_array
from .lora_inputs import LoRAInputs
from .packing import pack_step
from .page_ops import PageMover
from .penalties import PenaltyState
from .placement import Placement
from .runner_output import ModelRunnerOutput
from .sampling_inputs import SamplingInputs
from .step_layout import lay_out_step
from .step_programs import WINDOW_STOP_IDS, forward, multi_step, sample_step

logger = logging.getLogger(__name__)

# Attention backends whose cost does not grow with the block table's width
# (the kernels stop at each sequence's length): one P bucket, fewer programs.
FIXED_PAGE_BACKENDS = ("pallas", "pallas_triton")
# CPU decode steps of one sequence get their own one-row programs only for
# models whose rows cost something: at 135M parameters a 16-row step takes
# about twice a one-row step, while for a test-sized model the extra
# programs' compiles cost more than they save.
SMALL_DECODE_MIN_PARAMS = 10_000_000
# A first request's programs are built while the weights load
# (`build_first`) for models of at least this size: under it (the test
# suite's tiny models) the weights load too quickly to hide a build, and a
# guess that misses would only take CPU from the steps' own builds.
BUILD_FIRST_MIN_PARAMS = SMALL_DECODE_MIN_PARAMS


class ModelRunner:
    def __init__(self, files: ModelFiles, dtype, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, seed: int = 0,
                 attention_backend: str | None = None,
                 tensor_parallel_size: int = 1, max_logprobs: int = 20,
                 load_format: str = "auto", lora_config=None,
                 pipeline_parallel_size: int = 1, devices=None,
                 build_first: bool = False):
        # AWQ / GPTQ layers on one GPU multiply with the Pallas int4 kernel.
        self.cfg = with_int4_kernel(
            files.config, tensor_parallel_size * pipeline_parallel_size,
            jax.default_backend())
        self.dtype = dtype
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.block_size = cache_config.block_size
        self.seed = seed
        self.backend = resolve_backend(attention_backend)
        self.on_cpu = jax.default_backend() == "cpu"
        t0 = time.perf_counter()
        self.model = model_class(self.cfg.architecture)(
            self.cfg, backend=self.backend, dtype=dtype)
        self.placement = Placement(self.model, self.cfg, tensor_parallel_size,
                                   pipeline_parallel_size, devices)
        self.model = self.model.clone(mesh=self.placement.mesh)
        self.constants = model_constants(self.model,
                                         scheduler_config.max_model_len)
        self.kv_dtype = kv_page_dtype(cache_config.cache_dtype, dtype)
        self.max_pages_per_seq = cdiv(scheduler_config.max_model_len,
                                      self.block_size)
        self.buckets = Buckets.make(scheduler_config.max_num_batched_tokens,
                                    scheduler_config.max_num_seqs,
                                    self.max_pages_per_seq,
                                    fixed_pages=self.backend in FIXED_PAGE_BACKENDS,
                                    small_decode=self.on_cpu and
                                    self.cfg.num_params >= SMALL_DECODE_MIN_PARAMS)
        self.max_logprobs = max_logprobs
        self.sampling_inputs = SamplingInputs(
            self.cfg.vocab_size, scheduler_config.max_num_seqs, seed)
        self._make_programs()
        # A first request's programs start building now, on another core,
        # while the weights load (build_ahead.py, `start_first`).
        first = (build_first and lora_config is None
                 and load_format != "dummy" and self.can_build_first()
                 and self.build_ahead.start_first(self.expected_state()))
        if load_format == "dummy":  # random weights, drawn in their sharding
            self.params = random_params(self.model, self.cfg, dtype,
                                        self.placement.param_shardings,
                                        seed=seed)
        elif files.format == "orbax":  # restored straight into the sharding
            self.params = restore_params(files.source, self.model, self.cfg,
                                         dtype, self.placement.param_shardings)
        else:
            self.params = load_params(files, dtype,
                                      place=self.placement.place_param,
                                      elsewhere=self.placement.elsewhere)
        self.params = self.placement.finish_params(self.params)
        logger.info("loaded %s (%.1fM params) in %.1fs", files.source,
                    self.cfg.num_params / 1e6, time.perf_counter() - t0)
        # LoRA adapter slots, allocated before the KV pool is sized.
        self.lora = (LoRAInputs(self.model, self.cfg, lora_config, dtype,
                                self.placement.mesh) if lora_config else None)
        self.encoder = self._encoder_runner()  # None: the model takes text only
        self.num_blocks = self._num_blocks()
        self.kv_pages = self.placement.zeros_kv(
            self.cfg.num_layers, self.num_blocks, self.block_size,
            self.kv_dtype)
        if first:  # the programs stand only if the guess held
            self.build_ahead.confirm_first(self.params, self.kv_pages)
        # Host swap space in pages (whole pages: all kv heads, all layers).
        self.num_host_blocks = int(cache_config.swap_space * 2**30 //
                                   (self.page_bytes * self.placement.kv_shards))
        self.page_mover = PageMover(self.num_blocks, self.num_host_blocks)
        self.penalty_state: PenaltyState | None = None  # made on first use
        # Seconds from launching each step to its tokens being ready: with
        # no host/device overlap, the device's busy time.
        self.device_seconds = 0.0
        self.prev_rows: dict[str, int] = {}
        # What the runner knows of each request in the batch: sent once by
        # the scheduler when it joins (SchedulerOutput.new_requests).
        self.requests: dict[str, NewRequestData] = {}
        self._last_ready = 0.0  # when the last collected step was done

    def _make_programs(self) -> None:
        """The step's jitted programs and what selects them; nothing here
        reads the params or the pages, so it runs before they exist."""
        scheduler_config = self.scheduler_config
        # A step is two programs (step_programs.forward, sample_step): the
        # forward pass, one per bucket whatever the batch's sampling needs,
        # and the sampler, one per sampling variant and S. The logits
        # between them are pinned replicated, so the sampler's programs,
        # compiled ahead from their shapes, take them as they come.
        step_forward = functools.partial(
            forward, self.placement.step_model(self.model),
            logits_sharding=self.placement.replicated)
        self._forward = jax.jit(step_forward, static_argnums=(0,),
                                donate_argnums=(2,))
        # Few-row buckets on CPU compile with their own XLA options
        # (compile_options.py: XLA's dot emitter for few-row products).
        self.decode_options = decode_compile_options(self.on_cpu)
        self._forward_few_rows = None if not self.decode_options else jax.jit(
            step_forward, static_argnums=(0,), donate_argnums=(2,),
            compiler_options=self.decode_options)
        self._sample = jax.jit(sample_step, static_argnums=(0,),
                               donate_argnums=(2,))
        # Programs compiled ahead by warm-up, by forward_key / sample_key.
        self.programs: dict[tuple, object] = {}
        # The buckets steps have run in (`_bucket_program`), whose programs
        # jit has built: `builds_program` is False for them.
        self._buckets_run: set[tuple] = set()
        # Programs built on a background thread before their first step
        # (build_ahead.py); `_run` takes them.
        self.build_ahead = BuildAhead(self)
        # Multi-step decode programs (SchedulerOutput.num_steps > 1), built
        # on first use of each bucket. "scan": on the H200 a "while" window
        # cost 4-29% more per token than single steps (the host reads its
        # condition back each step), "scan" 1-2% (multi-step-h200.json).
        self.use_window_loop("scan")
        # The last step's sampled tokens on the device, padded to
        # max_num_seqs, and the row of each request that sampled in it.
        # (Committed like the step's own output, so that the first step and
        # the next share one compiled program.)
        self.prev_tokens = jax.device_put(
            jnp.zeros(scheduler_config.max_num_seqs, jnp.int32),
            self.placement.replicated)

    def can_build_first(self) -> bool:
        """Whether a first request's programs can be built before the
        weights load: on CPU, where the page pool's size does not follow
        the memory the weights take, with one process and one pipeline
        stage, for an unquantized text-only model of at least
        BUILD_FIRST_MIN_PARAMS (quantized params have their own layouts,
        which `Placement.param_structs` does not foresee)."""
        return (self.on_cpu and jax.process_count() == 1
                and self.cfg.num_params >= BUILD_FIRST_MIN_PARAMS
                and self.cfg.quantization is None
                and self.placement.pipeline_stages == 1
                and self.cfg.image_input is None
                and self.scheduler_config.num_scheduler_steps == 1)

    def expected_state(self) -> dict:
        """What the forward program reads besides the step's own inputs,
        before the weights load: the params and pages as they will be
        (ShapeDtypeStructs; the page pool as `_num_blocks` sizes it now),
        the constants and the previous tokens."""
        pages = self.placement.kv_structs(
            self.cfg.num_layers, self._num_blocks(), self.block_size,
            self.kv_dtype)
        return dict(params=self.placement.param_structs(self.dtype),
                    kv_pages=pages, constants=self.constants,
                    prev_tokens=self.prev_tokens)

    def _encoder_runner(self) -> EncoderRunner | None:
        image = self.cfg.image_input
        if image is None:
            return None
        slots = encoder_cache_slots(
            self.scheduler_config.max_num_batched_tokens, image.tokens_per_image)
        return EncoderRunner(self.model, image, slots, self.cfg.hidden_size,
                             image.num_channels, self.dtype,
                             self.placement.replicated)

    @property
    def num_encoder_slots(self) -> int:
        """Slots of the encoder-output cache (0: no encoder)."""
        return 0 if self.encoder is None else self.encoder.num_slots

    # -- sizing -----------------------------------------------------------

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across all layers, K and V (and fp8 pages'
        scales), on one device."""
        return page_bytes(self.cfg.num_layers, self.block_size,
                          self.cfg.num_kv_heads, self.cfg.head_dim,
                          self.kv_dtype, self.placement.kv_shards)

    def max_pages_per_array(self) -> int:
        """Pages a layer's page array may hold on one device."""
        return pages_per_array(self.cfg, self.placement, self.block_size)

    def _num_blocks(self) -> int:
        """The KV pool's page count (`kv_pool_size.num_kv_pages`; a
        multi-process runner agrees on one across processes)."""
        return num_kv_pages(self.cfg, self.placement, self.cache_config,
                            self.scheduler_config, self.block_size,
                            self.page_bytes, self.on_cpu)

    # -- one step ---------------------------------------------------------

    def prepare(self, out: SchedulerOutput):
        """Packs a step into host arrays padded to its bucket
        (`step_layout.lay_out_step`), with its sampling metadata."""
        sched = out.scheduled
        dims = self.step_dims(out)[:3]
        input_ids, positions, md, logits_idx = lay_out_step(
            sched, dims, self.block_size, self.prev_rows)
        smd = self.sampling_inputs.build(sched, self.requests, dims[1])
        return input_ids, positions, md, logits_idx, smd

    def step_dims(self, out: SchedulerOutput) -> tuple:
        """The step's bucket (T, S, P, decode_only)."""
        sched = out.scheduled
        n_tok = sum(len(s.token_ids) for s in sched)
        n_pages = max(len(s.block_table) for s in sched)
        decode_only = n_tok == len(sched)
        return (*self.buckets.pick(n_tok, len(sched), n_pages, decode_only),
                decode_only)

    def _bucket_program(self, out: SchedulerOutput) -> tuple:
        """What names the model program of a step's bucket (its forward, or
        its multi-step window): the leading fields of that program's key."""
        dims = self.step_dims(out)
        return (("forward", dims) if out.num_steps == 1
                else ("multi", out.num_steps, dims))

    def builds_program(self, out: SchedulerOutput) -> bool:
        """Whether dispatching ``out`` would first build its bucket's model
        program (trace it, then compile it or read it from the compilation
        cache): warm-up built none for that bucket and no step has run in
        it. (A new sampling variant's program is not foreseen: it is small.)"""
        if not out.scheduled:
            return False
        name = self._bucket_program(out)
        return name not in self._buckets_run and not any(
            key[:len(name)] == name for key in self.programs)

    def forward_args(self, packed, logits_idx, mm=None, lora_pool=None,
                     state: dict | None = None) -> tuple:
        """The forward program's dynamic arguments, in order. ``state``:
        the params, pages, constants and previous tokens to use instead of
        the runner's own (`expected_state`, before the weights load)."""
        if state is None:
            state = dict(params=self.params, kv_pages=self.kv_pages,
                         constants=self.constants,
                         prev_tokens=self.prev_tokens)
        return (state["params"], state["kv_pages"], state["constants"],
                state["prev_tokens"], packed, logits_idx, mm, lora_pool)

    @staticmethod
    def forward_key(dims, fwd_args) -> tuple:
        """What selects one compiled forward program: the bucket and the
        structure and shapes of the per-step inputs, the encoder cache's
        among them (params, pages and the LoRA pool never change shape:
        only whether the pool is there)."""
        return _shape_key(("forward", dims), fwd_args[4:7],
                          fwd_args[7] is not None)

    def sample_args(self, logits, state, smd, targets) -> tuple:
        """The sampler program's dynamic arguments, in order (``logits``:
        the forward program's, or their ShapeDtypeStruct when compiling
        ahead)."""
        return (logits, state, self.prev_tokens, smd, targets)

    def logits_struct(self, rows: int) -> jax.ShapeDtypeStruct:
        """What the forward program hands the sampler: [rows, V] float32,
        replicated."""
        return jax.ShapeDtypeStruct((rows, self.cfg.vocab_size), jnp.float32,
                                    sharding=self.placement.replicated)

    @staticmethod
    def sample_key(num_lp, smp_args) -> tuple:
        """What selects one compiled sampler program: the top-K logprobs
        (static), then the structure and shapes of the logits, penalty
        state, sampling metadata and prompt-logprob targets."""
        return _shape_key(("sample", num_lp), smp_args[:2] + smp_args[3:5],
                          False)

    def run_step(self, num_lp, dims, state, packed, logits_idx, smd, targets,
                 mm=None, lora_pool=None):
        """One step through its two programs (each compiled ahead by
        warm-up when there is one, else by jit's own cache on first use).
        Returns (SamplerOutput, prompt logprobs, kv_pages, penalty state,
        the step's tokens padded to max_num_seqs)."""
        fwd = self.forward_args(packed, logits_idx, mm, lora_pool)
        logits, kv_pages = self._run(self.forward_program(dims),
                                     self.forward_key(dims, fwd), (dims,), fwd)
        smp = self.sample_args(logits, state, smd, targets)
        out, prompt_lp, state, next_tokens = self._run(
            self._sample, self.sample_key(num_lp, smp), (num_lp,), smp)
        return out, prompt_lp, kv_pages, state, next_tokens

    def forward_program(self, dims):
        """The jitted forward of a bucket: few-row buckets (decode-only
        ones of DECODE_OPTIONS_ROWS sequences, prefill ones of at most
        PREFILL_OPTIONS_MAX_TOKENS tokens) have their own compiler options
        on CPU (`decode_options`, compile_options.py)."""
        if self._forward_few_rows is None:
            return self._forward
        lo, hi = DECODE_OPTIONS_ROWS
        decode_only = dims[3]
        if (lo <= dims[1] <= hi if decode_only
                else dims[0] <= PREFILL_OPTIONS_MAX_TOKENS):
            return self._forward_few_rows
        return self._forward

    def _run(self, jitted, key, static, dyn):
        program = self.programs.get(key)
        if program is None:
            program = self.build_ahead.take(key)
            if program is not None:
                self.programs[key] = program
        if program is not None:
            return program(*dyn)
        return jitted(*static, *dyn)

    def use_window_loop(self, loop: str) -> None:
        """How multi-step windows loop (`step_programs.WINDOW_LOOPS`); drops
        the window programs built so far."""
        self.window_loop = loop
        self._multi = jax.jit(functools.partial(
            multi_step, self.placement.step_model(self.model), self.block_size,
            loop=loop), static_argnums=(0, 1), donate_argnums=(3,))
        self.programs = {k: v for k, v in self.programs.items()
                         if k[0] != "multi"}

    def multi_step_args(self, packed, smd, stop_ids, lora_pool=None) -> tuple:
        """The multi-step program's dynamic arguments, in order."""
        return (self.params, self.kv_pages, self.constants, self.prev_tokens,
                packed, smd, stop_ids, lora_pool)

    def window_stop_ids(self, sched, S: int) -> np.ndarray | None:
        """[S, WINDOW_STOP_IDS] each row's first stop ids, padded with -1,
        for "while" windows; None for the others (they run to the end)."""
        if self.window_loop != "while":
            return None
        out = np.full((S, WINDOW_STOP_IDS), -1, np.int32)
        for i, s in enumerate(sched):
            ids = s.stop_ids[:WINDOW_STOP_IDS]
            out[i, :len(ids)] = ids
        return out

    @staticmethod
    def multi_step_key(num_steps, dims, dyn_args) -> tuple:
        """`program_key` of a multi-step program (its per-step inputs: the
        packed buffer, the sampling metadata and the stop ids)."""
        return _shape_key(("multi", num_steps, dims), dyn_args[4:7],
                          dyn_args[7] is not None)

    def run_multi_step(self, num_steps, dims, packed, smd, stop_ids,
                       lora_pool=None):
        """A window of decode steps through its program: warm-up's when it
        built one, else jit's own cache."""
        dyn = self.multi_step_args(packed, smd, stop_ids, lora_pool)
        return self._run(self._multi, self.multi_step_key(num_steps, dims, dyn),
                         (num_steps, dims), dyn)

    def dispatch(self, out: SchedulerOutput) -> "InFlightStep":
        """Enqueues one step on the device and returns without waiting.
        ``out`` is all the runner learns of the step (the requests joining
        the batch are sent whole, once: SchedulerOutput.new_requests)."""
        gone = out.finished_ids + out.preempted_ids
        self.sampling_inputs.release(gone)
        for rid in gone:
            self.requests.pop(rid, None)
        if self.encoder is not None:
            self.encoder.release(gone)
        for new in out.new_requests:
            self.requests[new.request_id] = new
        if out.has_copies:  # swaps, before the step
            self.kv_pages = self.page_mover.apply(self.kv_pages, out)
        if not out.scheduled:
            return InFlightStep(out, [], None, None, None, None)
        input_ids, positions, md, logits_idx, smd = self.prepare(out)
        mm = None
        if self.encoder is not None:  # images first, then the step reads them
            if out.encoder_inputs:
                self.encoder.encode(self.params, out, self.requests)
            mm = self.encoder.step_inputs(out.scheduled, self.requests,
                                          md.cu_q_lens, len(input_ids))
        plan = self.sampling_inputs.plan_prompt_logprobs(out.scheduled,
                                                         self.requests)
        wants_lp = [s.sample and self.requests[s.request_id]
                    .sampling_params.logprobs is not None for s in out.scheduled]
        num_lp = None
        if plan is not None or any(wants_lp):
            num_lp = self.max_logprobs
        state = None
        if smd.penalties is not None:
            if self.penalty_state is None:
                self.penalty_state = PenaltyState.zeros(
                    self.sampling_inputs.slots.rows, self.cfg.vocab_size)
            state, self.penalty_state = self.penalty_state, None
        targets = None
        if plan is not None:
            logits_idx = np.concatenate([logits_idx, plan.indices])
            targets = plan.targets
        dims = (len(input_ids), *md.block_tables.shape, md.decode_only)
        t0 = time.perf_counter()
        # Adapters the rows need go into device slots first (queued before
        # the step); a step of base-model rows keeps the program without LoRA.
        lora_slots = (None if self.lora is None else self.lora.token_slots(
            out.scheduled, self.requests, len(input_ids)))
        packed = pack_step(input_ids, positions, md, lora_slots)
        lora_pool = None if lora_slots is None else self.lora.pool.arrays
        # The bucket's program name from the dims laid out above (not
        # recounted from the step): see `_bucket_program`.
        self._buckets_run.add(("forward", dims) if out.num_steps == 1
                              else ("multi", out.num_steps, dims))
        if out.num_steps > 1:
            if num_lp is not None or state is not None or mm is not None:
                raise RuntimeError(  # the scheduler keeps these single-step
                    "a multi-step decode with logprobs, penalties or images")
            res, self.kv_pages, self.prev_tokens = self.run_multi_step(
                out.num_steps, dims, packed, smd,
                self.window_stop_ids(out.scheduled, dims[1]), lora_pool)
            prompt_lp = None
        else:
            res, prompt_lp, self.kv_pages, state, self.prev_tokens = self.run_step(
                num_lp, dims, state, packed, logits_idx, smd, targets, mm,
                lora_pool)
        self.prev_rows = {s.request_id: i for i, s in enumerate(out.scheduled)
                          if s.sample}
        if state is not None:
            self.penalty_state = state
        return InFlightStep(out, wants_lp, res, prompt_lp, plan, t0,
                            time.perf_counter(), dims=dims)

    def collect(self, step: "InFlightStep") -> ModelRunnerOutput:
        """Waits for a dispatched step and brings its results to the host."""
        if step.res is None:
            return ModelRunnerOutput({})
        jax.block_until_ready(step.res.token_ids)
        step.ready_at = time.perf_counter()
        # The host waits here anyway (collect reads the tokens); the device
        # worked on this step from its launch, or from the end of the step
        # before when that was later (overlap queues steps), to now: the
        # device-busy share of a run (BENCHMARKS.md `idle`).
        start = max(step.dispatched_at, self._last_ready)
        self.device_seconds += max(step.ready_at - start, 0.0)
        # The step timeline's device time leaves compiles out.
        step.device_start = max(step.launched_at, self._last_ready)
        self._last_ready = step.ready_at
        return self.sampling_inputs.collect(step.out.scheduled,
                                            step.wants_logprobs, step.res,
                                            step.prompt_lp, step.plan)


def _shape_key(static: tuple, per_step, with_pool: bool) -> tuple:
    """A program's cache key: its static arguments, then the structure and
    shapes of its per-step inputs, and whether the LoRA pool is passed."""
    leaves, tree = jax.tree_util.tree_flatten(per_step)
    return (*static, tree, tuple((x.shape, str(x.dtype)) for x in leaves),
            with_pool)


@dataclasses.dataclass
class InFlightStep:
    """A step enqueued on the device whose results the host has not read."""
    out: SchedulerOutput
    wants_logprobs: list[bool]  # per row: its request asked for logprobs
    res: object  # SamplerOutput (device arrays), None for an empty step
    prompt_lp: object
    plan: object
    dispatched_at: float | None  # perf_counter() before the call (compiles count as busy)
    launched_at: float | None = None  # when the call returned (compiled, enqueued)
    ready_at: float | None = None
    device_start: float | None = None  # when the device could start it
    dims: tuple | None = None  # the bucket (T, S, P, decode_only)
    # Engine bookkeeping for the step timeline.
    host_s: float = 0.0
    compiled: tuple = (0.0, 0)  # (seconds, programs) compiled by dispatch
    preempted: int = 0
    queue: tuple = (0, 0, 0)  # pages in use, running, waiting when scheduled
