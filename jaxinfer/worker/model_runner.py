"""`ModelRunner`: SchedulerOutput -> host arrays -> step programs -> an
in-flight step.

The only place that builds device arrays, and the owner of the device state
between steps (params, KV pages, the last step's tokens, penalty counts).
Each step is laid out as NumPy arrays padded to its bucket, transferred
once, and run by `StepPrograms` (step_programs.py, which owns everything
about compiling) with the page pool donated (updated in place).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models import ModelFiles, model_class, resolve_backend
from jaxinfer.models.fused_qkv import with_fused_qkv
from jaxinfer.models.quantization.methods import with_int4_kernel
from jaxinfer.models.runtime import model_constants

from ..config import CacheConfig, SchedulerConfig
from ..core.encoder_cache_manager import encoder_cache_slots
from ..core.scheduler_output import NewRequestData, SchedulerOutput
from ..pooling.step import PooledSteps
from ..spec_decode.draft_model import DraftModel
from ..spec_decode.eagle import EagleDrafter, read_eagle_config
from ..spec_decode.layout import spec_rows
from ..spec_decode.overlap import RowSources, jit_shift_layout, row_sources
from .buckets import Bucket
from .encoder_runner import EncoderRunner
from .kv_dtype import kv_page_dtype, page_bytes
from .kv_pool_size import num_kv_pages, pages_per_array
from .logprob_ops import LogprobArrays
from .lora_inputs import LoRAInputs
from .packing import pack_step
from .page_ops import PageMover
from .penalties import PenaltyState
from .placement import Placement
from .runner_output import ModelRunnerOutput
from .sampler import SamplerOutput
from .sampling_inputs import PromptLogprobPlan, SamplingInputs, prompt_logprob_rows
from .step_functions import window_stop_ids
from .step_layout import lay_out_step
from .step_programs import DeviceState, StepInputs, StepOutputs, StepPrograms
from .warmup import dummy_batch
from .weights import load_weights

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, files: ModelFiles, dtype, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, seed: int = 0,
                 attention_backend: str | None = None,
                 tensor_parallel_size: int = 1, max_logprobs: int = 20,
                 load_format: str = "auto", lora_config=None,
                 pipeline_parallel_size: int = 1, devices=None,
                 build_first: bool = False, pooling=None,
                 num_speculative_tokens: int = 0,
                 draft_model: str | None = None,
                 draft_method: str | None = None):
        # AWQ / GPTQ layers on one GPU multiply with the Pallas int4 kernel.
        self.cfg = with_int4_kernel(
            files.config, tensor_parallel_size * pipeline_parallel_size,
            jax.default_backend())
        # One q/k/v weight where it applies (models/fused_qkv.py).
        self.cfg = with_fused_qkv(self.cfg, jax.default_backend(),
                                  tensor_parallel_size,
                                  lora=lora_config is not None)
        self.dtype = dtype
        # A draft model or an EAGLE head, loaded with the weights.
        self.draft: DraftModel | EagleDrafter | None = None
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
        self.constants = model_constants(
            self.model, scheduler_config.max_model_len,
            self.placement.replicated if self.placement.mesh.size > 1 else None)
        self.kv_dtype = kv_page_dtype(cache_config.cache_dtype, dtype)
        self.max_logprobs = max_logprobs
        # An EAGLE head reads the target's hidden states at its taps: the
        # forward programs return them (its config is read before they are
        # made; its weights load after the target's).
        eagle = None
        if draft_model is not None and draft_method in ("eagle", "eagle3"):
            eagle = read_eagle_config(draft_method, draft_model, self.cfg)
        self.sampling_inputs = SamplingInputs(
            self.cfg.vocab_size, scheduler_config.max_num_seqs, seed,
            count_width=scheduler_config.max_num_batched_tokens)
        self.programs = StepPrograms(self.model, self.placement,
                                     scheduler_config, cache_config,
                                     self.sampling_inputs, lora_config,
                                     self.on_cpu, max_logprobs=max_logprobs,
                                     num_speculative_tokens=num_speculative_tokens,
                                     hidden_taps=None if eagle is None else eagle.taps)
        # The last step's sampled tokens on the device, padded to
        # max_num_seqs (committed like the step's own output, so that the
        # first step and the next share one compiled program).
        self.prev_tokens = jax.device_put(
            jnp.zeros(scheduler_config.max_num_seqs, jnp.int32),
            self.placement.replicated)
        # A first request's programs start building now, on another core,
        # while the weights load (build_ahead.py, `start_first`).
        first = (build_first and load_format != "dummy"
                 and self.programs.can_build_first()
                 and self.programs.build_ahead.start_first(
                     self.expected_state()))
        self.params = load_weights(files, self.model, self.cfg, dtype,
                                   self.placement, load_format, seed)
        logger.info("loaded %s (%.1fM params) in %.1fs", files.source,
                    self.cfg.num_params / 1e6, time.perf_counter() - t0)
        # A draft model (speculative_config method "draft_model"): its
        # weights load before the KV pool is sized, its pages ride the
        # target's block tables (spec_decode/draft_model.py).
        if eagle is not None and draft_model is not None:
            self.draft = EagleDrafter(
                draft_model, eagle, target_model=self.model,
                target_params=self.params, placement=self.placement,
                dtype=dtype, kv_dtype=self.kv_dtype,
                block_size=self.block_size,
                max_model_len=scheduler_config.max_model_len,
                num_speculative_tokens=num_speculative_tokens,
                tensor_parallel_size=tensor_parallel_size,
                pipeline_parallel_size=pipeline_parallel_size)
        elif draft_model is not None:
            self.draft = DraftModel(
                draft_model, target_cfg=self.cfg, dtype=dtype,
                kv_dtype=self.kv_dtype, block_size=self.block_size,
                max_model_len=scheduler_config.max_model_len,
                num_speculative_tokens=num_speculative_tokens,
                load_format=load_format, seed=seed, backend=self.backend,
                devices=devices, tensor_parallel_size=tensor_parallel_size,
                pipeline_parallel_size=pipeline_parallel_size)
        # LoRA adapter slots, allocated before the KV pool is sized.
        self.lora = (LoRAInputs(self.model, self.cfg, lora_config, dtype,
                                self.placement.mesh) if lora_config else None)
        self.encoder = self._encoder_runner()  # None: the model takes text only
        # A pooling engine (jaxinfer/pooling/): steps return pooled rows,
        # never tokens. ``pooling`` is its PoolerConfig; None: generation.
        self.pooling = pooling
        self.pooled = None if pooling is None else PooledSteps(
            self.placement.step_model(self.model), pooling.pooling_type)
        self.num_blocks = self._num_blocks()
        self.kv_pages = self.placement.zeros_kv(
            self.cfg.num_layers, self.num_blocks, self.block_size,
            self.kv_dtype)
        if first:  # the programs stand only if the guess held
            self.programs.build_ahead.confirm_first(self.params, self.kv_pages)
        # Host swap space in pages (whole pages: all kv heads, all layers).
        self.num_host_blocks = int(cache_config.swap_space * 2**30 //
                                   (self.page_bytes * self.placement.kv_shards))
        self.page_mover = PageMover(self.num_blocks, self.num_host_blocks)
        if self.draft is not None:
            self.draft.allocate(self.num_blocks, self.num_host_blocks)
        self.penalty_state: PenaltyState | None = None  # made on first use
        # Seconds from launching each step to its tokens being ready: with
        # no host/device overlap, the device's busy time.
        self.device_seconds = 0.0
        # Each sampling request's row in the last step (its token there is
        # read on the device: step_layout.py).
        self.prev_rows: dict[str, int] = {}
        # A verifying step's drafts per request and its accepted counts
        # (device, [max_num_seqs]): the next step, laid out before they
        # are read, is corrected by them (spec_decode/overlap.py).
        self.prev_drafts: dict[str, int] = {}
        self.prev_accepted = self.prev_tokens
        self._shift_layout = (None if self.draft is None else jit_shift_layout(
            self.block_size, self.placement.replicated))
        # What the runner knows of each request in the batch: sent once by
        # the scheduler when it joins (SchedulerOutput.new_requests).
        self.requests: dict[str, NewRequestData] = {}
        self._last_ready = 0.0  # when the last collected step was done
        # The programs a step can run, over the final device state.
        self.programs.enumerate_from(self.device_state(), *self._extra_inputs())

    def _extra_inputs(self) -> tuple:
        """(LoRA pool, encoder cache): the programs' optional inputs."""
        return (None if self.lora is None else self.lora.pool.arrays,
                None if self.encoder is None else self.encoder.cache)

    def device_state(self) -> DeviceState:
        """What the step programs read besides the step's own inputs."""
        return DeviceState(self.params, self.kv_pages, self.constants,
                           self.prev_tokens)

    def expected_state(self) -> DeviceState:
        """`device_state` before the weights load: the params and pages as
        they will be (ShapeDtypeStructs; the page pool as `_num_blocks`
        sizes it now)."""
        pages = self.placement.kv_structs(
            self.cfg.num_layers, self._num_blocks(), self.block_size,
            self.kv_dtype)
        return DeviceState(self.placement.param_structs(self.dtype), pages,
                           self.constants, self.prev_tokens)

    def warm_up(self, compilation_cache_dir: str | None = None
                ) -> tuple[int, float]:
        """Builds every step program ahead (`StepPrograms.warm_up`), and
        the page copy, image encoder, adapter slot and draft model
        programs. Returns (programs, seconds)."""
        t0 = time.perf_counter()
        lora_pool, encoder_cache = self._extra_inputs()
        compiled, loaded, _ = self.programs.warm_up(
            self.device_state(), compilation_cache_dir,
            lora_pool=lora_pool, encoder_cache=encoder_cache)
        self.kv_pages, n_copy = self.page_mover.warm_up(
            self.kv_pages, self.scheduler_config.preemption_mode == "swap")
        if self.encoder is not None:  # one program per image batch size
            n_copy += self.encoder.warm_up(self.params)
        if self.lora is not None:  # the adapter slot writer
            self.lora.pool.warm_up()
            n_copy += 1
        if self.draft is not None:  # its pass and proposal per bucket
            n_copy += self.draft.warm_up(self.programs.buckets)
            n_copy += self._warm_shift_layout()
        jax.block_until_ready(self.kv_pages)
        seconds = time.perf_counter() - t0
        logger.info("warm-up built %d copy, encoder, adapter and draft "
                    "programs; %.1fs in all",
                    n_copy, seconds)
        return compiled + loaded + n_copy, seconds

    def _warm_shift_layout(self) -> int:
        """Builds the layout correction of every bucket (a step's or a
        proposal's). Returns how many programs that was."""
        shapes = self.programs.buckets.all_shapes()
        for bucket in shapes:
            T, S, P = bucket[:3]
            packed = pack_step(*dummy_batch(T, S, P)[:3])
            none = RowSources(np.zeros(S, np.int32), np.zeros(S, np.int32))
            self.shift_layout(bucket, packed, none)
        return len(shapes)

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
        scales), on one device; a draft model's page of the same tokens
        included."""
        return page_bytes(self.cfg.num_layers, self.block_size,
                          self.cfg.num_kv_heads, self.cfg.head_dim,
                          self.kv_dtype, self.placement.kv_shards) + (
            0 if self.draft is None else self.draft.page_bytes)

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

    def prepare(self, out: SchedulerOutput, wants_logprobs=()):
        """Packs a step into host arrays padded to its bucket
        (`step_layout.lay_out_step`), with its sampling metadata."""
        sched = out.scheduled
        T, S, P, decode_only, max_q_len = self.programs.bucket(out)
        input_ids, positions, md, logits_idx = lay_out_step(
            sched, (T, S, P), self.block_size, self.prev_rows, decode_only,
            max_q_len)
        smd = self.sampling_inputs.build(sched, self.requests, S,
                                         wants_logprobs)
        return input_ids, positions, md, logits_idx, smd

    def _admit(self, out: SchedulerOutput) -> None:
        """Requests joining and leaving the batch, and page copies (swaps),
        before the step."""
        gone = out.finished_ids + out.preempted_ids
        self.sampling_inputs.release(gone)
        if self.pooled is not None:  # a swapped prompt keeps its partial pool
            self.pooled.rows.release(out.finished_ids)
        for rid in gone:
            self.requests.pop(rid, None)
        if self.encoder is not None:
            self.encoder.release(gone)
        for new in out.new_requests:
            self.requests[new.request_id] = new
        if out.has_copies:
            self.kv_pages = self.page_mover.apply(self.kv_pages, out)
            if self.draft is not None:
                self.draft.copy_pages(out)

    def shift_layout(self, bucket: Bucket, packed, sources: RowSources):
        """A layout made before the step before was read, corrected on the
        device by that step's accepted drafts (spec_decode/overlap.py).
        Returns (packed, shift [S]) on the device."""
        if self._shift_layout is None:
            raise RuntimeError("a step laid out ahead of a verifying step "
                               "without a drafter on the device")
        row, drafts = sources.padded(bucket[1])
        return self._shift_layout(bucket, packed, self.prev_accepted, row,
                                  drafts, self.prev_tokens)

    def _step_inputs(self, out: SchedulerOutput,
                     sources: RowSources | None = None):
        """The step as `StepInputs`, with each row's wish for logprobs and
        the prompt-logprob plan (for `collect`). ``sources``: the rows'
        corrections when the step before is still in flight."""
        wants_lp = [s.sample and self.requests[s.request_id]
                    .sampling_params.logprobs is not None for s in out.scheduled]
        input_ids, positions, md, logits_idx, smd = self.prepare(out, wants_lp)
        encoder = None
        if self.encoder is not None:  # images first, then the step reads them
            if out.encoder_inputs:
                self.encoder.encode(self.params, out, self.requests)
            encoder = self.encoder.step_inputs(out.scheduled, self.requests,
                                               md.cu_q_lens, len(input_ids))
        plan = self.sampling_inputs.plan_prompt_logprobs(
            out.scheduled, self.requests,
            prompt_logprob_rows(len(input_ids), self.scheduler_config))
        # The full sampler tier (penalty params present) returns top
        # logprobs; the plain tier none.
        num_lp = self.max_logprobs if smd.penalties is not None else None
        targets = None
        S, P = md.block_tables.shape
        drafts = num_drafts = None
        shift = np.zeros(S, np.int32)
        k = self.programs.num_speculative_tokens
        # k + 1 scored rows per sequence, and its drafts; a decode-only step
        # in which no row drafts runs as a plain step (StepPrograms.run),
        # unless its rows are corrected on the device (their output index
        # with them, which the verifying sampler takes).
        if k and (not md.decode_only or sources is not None
                  or any(s.num_draft_tokens for s in out.scheduled)):
            logits_idx, drafts, num_drafts = spec_rows(out.scheduled, S, k,
                                                       md.cu_q_lens)
        if plan is not None:
            logits_idx = np.concatenate([logits_idx, plan.indices])
            targets = plan.targets
        bucket = Bucket(len(input_ids), S, P, md.decode_only, md.max_q_len)
        # Adapters the rows need go into device slots first (queued before
        # the step); a step of base-model rows keeps the program without LoRA.
        lora_slots = lora_pool = None
        if self.lora is not None:
            lora_slots = self.lora.token_slots(out.scheduled, self.requests,
                                               len(input_ids))
            if lora_slots is not None:
                lora_pool = self.lora.pool.arrays
        packed = pack_step(input_ids, positions, md, lora_slots)
        if sources is not None:
            packed, shift = self.shift_layout(bucket, packed, sources)
        inputs = StepInputs(
            bucket, packed, smd,
            logits_idx, num_lp, targets, encoder, lora_pool, out.num_steps,
            drafts=drafts, num_drafts=num_drafts, shift=shift,
            count_chunks=self.sampling_inputs.take_count_chunks())
        if out.num_steps > 1:
            if (num_lp is not None or smd.penalties is not None
                    or encoder is not None):
                raise RuntimeError(  # the scheduler keeps these single-step
                    "a multi-step decode with logprobs, penalties or images")
            inputs.stop_ids = window_stop_ids(
                out.scheduled, bucket.seqs, self.programs.window_loop)
        return inputs, wants_lp, plan

    def dispatch(self, out: SchedulerOutput,
                 fill_token_masks: Callable[[np.ndarray], None] | None = None
                 ) -> InFlightStep:
        """Enqueues one step on the device and returns without waiting.
        ``out`` is all the runner learns of the step (the requests joining
        the batch are sent whole, once: SchedulerOutput.new_requests).
        ``fill_token_masks(bitmask)``: called between the forward and the
        sampler programs when rows are constrained by a grammar."""
        self._admit(out)
        if not out.scheduled:
            return InFlightStep(out, [], None, None, None, None)
        if self.pooled is not None:
            return self._dispatch_pooled(out)
        # A first request other than start_first's guess: the guess's queued
        # builds would only compete with this step's own.
        self.programs.build_ahead.drop_missed_first(out)
        t0 = time.perf_counter()
        draft = self.draft
        # Rows whose first input is the step before's pending token: laid
        # out as if it accepted all its drafts, corrected on the device.
        sources = (None if draft is None else row_sources(
            out.scheduled, self.prev_rows, self.prev_drafts))
        proposal = (None if draft is None else draft.propose(
            out.scheduled, self.programs.buckets, self.prev_rows,
            None if sources is None else functools.partial(
                self._shift_rows, sources)))
        inputs, wants_lp, plan = self._step_inputs(out, sources)
        if draft is not None:  # one transfer for both models; drafts in
            inputs.packed, inputs.drafts = draft.place_inputs(
                proposal, out.scheduled, inputs.packed, inputs.drafts)
        inputs.fill_token_masks = fill_token_masks
        outputs = self.run_programs(inputs, self._take_penalty_state(inputs))
        self._keep(outputs)
        if self.draft is not None:  # its pages take the step's tokens too
            self.draft.mirror(inputs.bucket, inputs.packed, outputs.hidden)
        launched = time.perf_counter()
        self.prev_rows = {s.request_id: i for i, s in enumerate(out.scheduled)
                          if s.sample}
        self.prev_drafts = {}
        if inputs.drafts is not None:
            self.prev_accepted = outputs.sampled.num_accepted
            self.prev_drafts = {s.request_id: s.num_draft_tokens
                                for s in out.scheduled if s.num_draft_tokens}
        # The decode buckets after this step build in the background while
        # it runs, when not built yet (build_ahead.py).
        self.programs.build_ahead.request(out, self.device_state(),
                                          self.requests)
        return InFlightStep(out, wants_lp, outputs.sampled,
                            outputs.prompt_logprobs, plan, t0, launched,
                            dims=inputs.bucket)

    def _shift_rows(self, sources: RowSources, rows: list[int],
                    bucket: Bucket, packed):
        """A proposal's layout (``rows``: their step rows) corrected as
        its step's."""
        return self.shift_layout(bucket, packed, sources.take(rows))[0]

    def _dispatch_pooled(self, out: SchedulerOutput) -> InFlightStep:
        """A pooling engine's step: the forward pass reduced per row
        (jaxinfer/pooling/step.py); nothing is sampled."""
        if self.pooled is None:
            raise RuntimeError("a pooled step on a generating runner")
        T, S, P, decode_only, max_q_len = self.programs.bucket(out)
        input_ids, positions, md, last_idx = lay_out_step(
            out.scheduled, (T, S, P), self.block_size, {}, decode_only,
            max_q_len)
        bucket = Bucket(len(input_ids), S, P, md.decode_only, md.max_q_len)
        t0 = time.perf_counter()
        rows, self.kv_pages = self.pooled.run(
            bucket, self.params, self.kv_pages, self.constants,
            pack_step(input_ids, positions, md, None), last_idx)
        return InFlightStep(out, [], None, None, None, t0,
                            time.perf_counter(), dims=bucket, pooled=rows)

    def run_programs(self, inputs: StepInputs, penalty_state) -> StepOutputs:
        """The step's programs over the runner's device state."""
        return self.programs.run(self.device_state(), inputs, penalty_state)

    def _take_penalty_state(self, inputs: StepInputs) -> PenaltyState | None:
        """The penalty counts, for a step that applies penalties (donated
        to it: the runner holds none until the step returns them)."""
        if inputs.sampling.penalties is None:
            return None
        if self.penalty_state is None:
            # Made from host zeros, in the layout warm-up built the
            # sampler for (a jitted zeros would be one more program).
            shape = (self.sampling_inputs.slots.rows, self.cfg.vocab_size)
            sharding = self.placement.replicated

            def zeros(dtype):
                return jax.make_array_from_callback(
                    shape, sharding, lambda idx: np.zeros(shape, dtype)[idx])
            self.penalty_state = PenaltyState(zeros(np.int32), zeros(np.bool_))
        state, self.penalty_state = self.penalty_state, None
        return state

    def _keep(self, outputs: StepOutputs) -> None:
        """The device state a step returns."""
        self.kv_pages, self.prev_tokens = outputs.kv_pages, outputs.next_tokens
        if outputs.penalty_state is not None:
            self.penalty_state = outputs.penalty_state

    def collect(self, step: InFlightStep) -> ModelRunnerOutput:
        """Waits for a dispatched step and brings its results to the host."""
        if step.pooled is not None:
            return self._collect_pooled(step)
        if step.res is None:
            return ModelRunnerOutput({})
        if step.dispatched_at is None or step.launched_at is None:
            raise RuntimeError("a step with results but no dispatch times")
        jax.block_until_ready(step.res.token_ids)
        step.ready_at = ready_at = time.perf_counter()
        # The host waits here anyway (collect reads the tokens); the device
        # worked on this step from its launch, or from the end of the step
        # before when that was later (overlap queues steps), to now: the
        # device-busy share of a run.
        start = max(step.dispatched_at, self._last_ready)
        self.device_seconds += max(ready_at - start, 0.0)
        # The step timeline's device time leaves compiles out.
        step.device_start = max(step.launched_at, self._last_ready)
        self._last_ready = ready_at
        return self.sampling_inputs.collect(step.out.scheduled,
                                            step.wants_logprobs, step.res,
                                            step.prompt_lp, step.plan)


    def _collect_pooled(self, step: InFlightStep) -> ModelRunnerOutput:
        if self.pooled is None or step.dispatched_at is None:
            raise RuntimeError("a pooled step without its pooler")
        rows = np.asarray(jax.device_get(step.pooled))
        now = time.perf_counter()
        self.device_seconds += max(now - max(step.dispatched_at,
                                             self._last_ready), 0.0)
        step.ready_at = self._last_ready = now
        step.device_start = step.launched_at
        return ModelRunnerOutput(
            {}, pooled=self.pooled.rows.add(step.out.scheduled, rows))


@dataclasses.dataclass
class InFlightStep:
    """A step enqueued on the device whose results the host has not read."""
    out: SchedulerOutput
    wants_logprobs: list[bool]  # per row: its request asked for logprobs
    res: SamplerOutput | None  # device arrays; None for an empty step
    prompt_lp: LogprobArrays | None  # device arrays, when the plan asks
    plan: PromptLogprobPlan | None
    dispatched_at: float | None  # perf_counter() before the call (compiles count as busy)
    launched_at: float | None = None  # when the call returned (compiled, enqueued)
    ready_at: float | None = None
    device_start: float | None = None  # when the device could start it
    dims: Bucket | None = None  # the step's bucket
    pooled: Any = None  # pooling engines: [S, 3, D] per-row reductions
