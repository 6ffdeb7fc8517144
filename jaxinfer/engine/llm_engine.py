"""`LLMEngine`: add_request / step / abort_request over scheduler + runner."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import jax
import numpy as np

from jaxinfer.models import resolve_dtype, resolve_model, resolve_tokenizer

from ..config import EngineArgs, derived_max_model_len
from ..core.scheduler import Scheduler
from ..core.scheduler_output import SchedulerOutput
from ..distributed.parallel_config import check_fits
from ..distributed.step_broadcast import runner_class
from ..errors import InvalidConfigError, InvalidRequestError, UnsupportedFeatureError
from ..lora.errors import LoRANotEnabledError
from ..lora.request import LoRARequest
from ..lora.store import AdapterStore
from ..multimodal.processor import make_image_processor
from ..outputs import PoolingOutput, PoolingRequestOutput, RequestMetrics, RequestOutput
from ..pooling.engine_checks import check_runner, pooling_engine
from ..pooling.rows import finish_pooled
from ..request import Request, RequestStatus
from ..sampling_params import SamplingParams
from ..spec_decode.stats import SpecDecodeStats
from ..structured.grammar import GrammarCompiler
from ..tokenizer import load_tokenizer
from ..worker.kv_pool_size import claim_device_memory
from ..worker.model_runner import InFlightStep
from ..worker.runner_output import ModelRunnerOutput
from ..worker.warmup import enable_compilation_cache
from .input_processor import InputProcessor, ProcessedInput
from .output_processor import OutputProcessor
from .parallel_sampling import ParallelSampling
from .step_timeline import CompileClock, StepTimeline

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineStats:
    """A snapshot for monitoring; counters are totals since start."""
    num_running: int  # requests in the running batch
    num_waiting: int  # requests queued (new, preempted or swapped)
    num_swapped: int  # of the waiting, those whose pages sit in host memory
    kv_cache_usage: float  # share of usable device pages held by requests
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of which were found (not computed)
    prefix_cache_hit_rate: float  # hits / queries (0 before any query)
    num_preemptions: int  # preemptions, recompute and swap
    num_swap_outs: int  # of which by swap
    num_prompt_tokens: int  # prompt tokens of requests added
    num_generation_tokens: int  # tokens sampled
    num_steps: int = 0  # steps run
    last_step_tokens: int = 0  # tokens the latest step scheduled
    num_step_programs: int = 0  # step programs built or run so far
    num_known_step_programs: int = 0  # the enumerated set they stay within
    num_compiles: int = 0  # XLA compiles (and compilation-cache loads) so far
    compile_seconds: float = 0.0  # time spent on them
    # Speculative decoding (None when off): drafts and acceptance so far.
    spec_decode: SpecDecodeStats | None = None


class LLMEngine:
    def __init__(self, args: EngineArgs, devices=None):
        """One replica over ``devices`` (default: every device; a
        data-parallel front gives each replica its own)."""
        self.args = args
        # Before anything starts JAX's backends: XLA's allocator takes its
        # share of the card once, when the backend starts.
        claim_device_memory(args.gpu_memory_utilization)
        self.files = resolve_model(args.model, args.load_format,
                                   quantization=args.quantization)
        self.model_config = self.files.config
        on_cpu = jax.default_backend() == "cpu"
        self.cache_config = args.cache_config()
        self.scheduler_config = args.scheduler_config(
            derived_max_model_len(self.model_config), on_cpu)
        self.parallel_config = args.parallel_config()
        check_fits(dataclasses.replace(self.parallel_config,
                                       data_parallel_size=1),
                   self.model_config, len(devices or jax.devices()),
                   jax.default_backend(), self.scheduler_config.preemption_mode,
                   jax.process_count(), enable_lora=args.enable_lora,
                   num_scheduler_steps=args.num_scheduler_steps)
        self.dtype = resolve_dtype(args.dtype, self.model_config)
        self.tokenizer = load_tokenizer(
            resolve_tokenizer(args.tokenizer) if args.tokenizer else self.files.tokenizer)
        self.compilation_cache_dir = enable_compilation_cache(
            args.compilation_cache_dir)
        CompileClock.install()  # the compile counter /metrics reports
        self.lora_config = args.lora_config()  # None: LoRA off
        # A pooling engine's PoolerConfig (jaxinfer/pooling/); None: generate.
        self.pooler = pooling_engine(args, self.files, jax.process_count())
        self.speculative = args.speculative()  # None: off
        self._check_speculative()
        self.spec_stats = (None if self.speculative is None else
                           SpecDecodeStats(
                               self.speculative.num_speculative_tokens))
        self.warmup = args.resolved_warmup(jax.default_backend(),
                                           pooling=self.pooler is not None)
        # A DistributedRunner when the program spans several processes.
        self.runner = runner_class()(
            self.files, self.dtype, self.scheduler_config, self.cache_config,
            seed=args.seed, attention_backend=args.attention_backend,
            tensor_parallel_size=args.tensor_parallel_size,
            max_logprobs=self.max_logprobs, load_format=args.load_format,
            pipeline_parallel_size=args.pipeline_parallel_size,
            devices=devices, lora_config=self.lora_config,
            # Without warm-up, a first request's programs build while the
            # weights load (build_ahead.py).
            build_first=not self.warmup and self.pooler is None,
            pooling=self.pooler,
            num_speculative_tokens=(0 if self.speculative is None else
                                    self.speculative.num_speculative_tokens),
            draft_model=(self.speculative.model if self.speculative is not None
                         and self.speculative.uses_draft_model else None),
            draft_method=(None if self.speculative is None
                          else self.speculative.method))
        # Loaded adapters in host memory (jaxinfer/lora/store.py).
        self.lora_store = self.runner.lora.store if self.runner.lora else None
        capacity = (self.runner.num_blocks - 1) * self.cache_config.block_size
        if capacity < self.max_model_len:
            raise InvalidConfigError(
                f"the KV cache holds {capacity} tokens "
                f"({self.runner.num_blocks - 1} pages of "
                f"{self.cache_config.block_size}), fewer than max_model_len="
                f"{self.max_model_len}: raise num_gpu_blocks_override / "
                f"gpu_memory_utilization or lower max_model_len")
        self.scheduler = Scheduler(
            self.scheduler_config, self.cache_config, self.runner.num_blocks,
            self.runner.num_host_blocks, self.runner.num_encoder_slots,
            max_loras=self.lora_config.max_loras if self.lora_config else None,
            speculative_config=self.speculative)
        self.image_processor = make_image_processor(
            self.files, args, self.tokenizer)  # None: the model takes text only
        self.warmup_programs, self.warmup_seconds = (
            self.runner.warm_up(self.compilation_cache_dir)
            if self.warmup else (0, 0.0))
        self.num_prompt_tokens = self.num_generation_tokens = 0
        self.num_steps = self.last_step_tokens = 0
        self.output_processor = OutputProcessor(self.tokenizer)
        self.parallel = ParallelSampling()  # n > 1 requests
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))
        self._counter = 0
        # --profile-steps: one JSON line per step (step_timeline.py).
        self.timeline = (StepTimeline(args.profile_steps)
                         if args.profile_steps else None)
        # A dispatched step whose tokens are unread (overlapped steps).
        self._inflight: InFlightStep | None = None
        # Outputs of the step in flight when it was read early, to fill the
        # next step's grammar masks (_fill_token_masks); returned by step().
        self._read_early: list[RequestOutput] = []
        # (SchedulerOutput, preemptions) scheduled but not yet dispatched:
        # the last call returned the step in flight's tokens first.
        self._deferred: tuple[SchedulerOutput, int] | None = None
        self._step = (self._overlapped_step if args.async_scheduling
                      else self._plain_step)

    def _check_speculative(self) -> None:
        """Engine-wide combinations speculative decoding does not serve."""
        if self.speculative is None:
            return
        if self.pooler is not None:
            raise UnsupportedFeatureError(
                "speculative_config", "speculative decoding in a pooling "
                "engine", "pooling samples nothing: drop speculative_config")
        if jax.process_count() > 1:
            raise UnsupportedFeatureError(
                "speculative_config", "speculative decoding over several "
                "processes", "run it on one process (tensor parallelism "
                "within one host is served)")

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        """The engine the args describe: one replica, a data-parallel front
        over several, or a multi-process / Ray engine
        (jaxinfer/distributed/launch.py)."""
        from ..distributed.launch import make_engine
        return make_engine(cls, args)

    @property
    def max_logprobs(self) -> int:
        """max_logprobs, with vLLM's -1 (the whole vocabulary) resolved."""
        if self.args.max_logprobs == -1:
            return self.model_config.vocab_size
        return self.args.max_logprobs

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    # -- requests ---------------------------------------------------------

    @functools.cached_property
    def input_processor(self) -> InputProcessor:
        """Checks and tokenizes requests (shared with the servers)."""
        return InputProcessor(
            self.tokenizer, vocab_size=self.model_config.vocab_size,
            max_model_len=self.max_model_len,
            max_logprobs=self.max_logprobs,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            images=self.image_processor,
            architecture=self.model_config.architecture,
            lora_store=self.lora_store,
            grammars=GrammarCompiler(self.tokenizer,
                                     self.model_config.vocab_size,
                                     self.eos_token_ids))

    def add_request(self, request_id: str | None, prompt: Any,
                    params: SamplingParams | None = None,
                    arrival_time: float | None = None,
                    lora_request: LoRARequest | None = None,
                    priority: int = 0) -> str:
        """Validates and queues a request; raises InvalidRequestError (a
        ValueError) without touching the requests in flight. ``prompt`` may
        be a `ProcessedInput` (then ``params`` and ``lora_request`` are
        ignored: it carries its own), which skips the checks already made."""
        if not isinstance(prompt, ProcessedInput):
            prompt = self.input_processor.process(prompt, params,
                                                  lora_request=lora_request)
        text, ids, params = prompt.prompt, prompt.prompt_token_ids, prompt.params
        if self.speculative is not None and params.structured_outputs is not None:
            raise UnsupportedFeatureError(
                "structured_outputs", "structured output together with "
                "speculative decoding", "send the request to an engine "
                "started without speculative_config")
        adapter = prompt.lora
        check_runner(self.pooler, prompt.pooling, self.model_config.hidden_size)
        if priority != 0 and self.scheduler_config.policy != "priority":
            # As vLLM: a priority an fcfs engine would not honour is refused.
            raise InvalidRequestError(
                f"priority={priority} was given, but the engine schedules "
                "fcfs: start it with scheduling_policy='priority' "
                "(--scheduling-policy priority) or leave priority at 0")
        if request_id is None:
            request_id = str(self._counter)
        elif request_id in self.scheduler.requests:
            raise InvalidRequestError(
                f"request id {request_id!r} is already in flight: use a new id")
        self._counter += 1
        req = Request(request_id, ids, params, self.eos_token_ids,
                      arrival_time=arrival_time, priority=priority, prompt=text,
                      max_model_len=self.max_model_len,
                      mm_inputs=prompt.mm_inputs,
                      # Pages computed under an adapter are its own.
                      extra_keys=None if adapter is None else ("lora", adapter.key),
                      lora_request=None if adapter is None else adapter.request,
                      pooling_params=prompt.pooling,
                      skip_prefix_cache=(prompt.pooling is not None
                                         and self.pooler is not None
                                         and self.pooler.pools_every_token))
        for r in self.parallel.add(req):  # n > 1: n ordinary requests
            if adapter is not None:  # held in host memory until it finishes
                self._lora("a LoRA adapter").acquire(r.request_id, adapter)
            self.scheduler.add_request(r)
            if r.pooling_params is None:
                self.output_processor.add_request(r)
        self.num_prompt_tokens += len(ids)
        return request_id

    def abort_request(self, request_ids) -> None:
        ids = self.parallel.expand(request_ids)
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        self.output_processor.abort_requests(ids)

    def has_unfinished_requests(self) -> bool:
        # A step still in flight only matters while one of its requests is
        # alive (a request whose last token is pending stays in the
        # scheduler until that token is read).
        return self.scheduler.has_unfinished_requests()

    # -- the loop ---------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One engine step: `_plain_step`, or `_overlapped_step` under
        async_scheduling (chosen at start)."""
        return self._step()

    def _plain_step(self) -> list[RequestOutput]:
        """Schedule a step, run it, and read its tokens."""
        t0 = time.perf_counter()
        inflight = self._dispatch(*self._schedule(), t0)
        return [] if inflight is None else self._finish(inflight)

    def _fill_token_masks(self, sched_out: SchedulerOutput,
                          bitmask: np.ndarray) -> None:
        """Between a step's forward and sampler programs: reads the step
        still in flight (its tokens advance the grammars) and fills the
        constrained rows' masks, while the device runs the forward pass.
        So a batch under grammars keeps the host/device overlap."""
        self._read_early += self._finish_inflight()
        self.scheduler.fill_token_masks(sched_out, bitmask)

    def _take_read_early(self) -> list[RequestOutput]:
        outputs, self._read_early = self._read_early, []
        return outputs

    def _overlapped_step(self) -> list[RequestOutput]:
        """Step N+1 is scheduled and enqueued before step N's tokens are
        read, so the device never waits on the host; those tokens feed N+1
        on the device, and a request that stopped at N drops its N+1
        token. A step whose bucket has no program yet is held back one
        call: building it takes far longer than the step in flight, whose
        tokens are returned first."""
        overlap = self._overlap_ok()
        outputs: list[RequestOutput] = []
        if not overlap:
            outputs += self._finish_inflight()
        t0 = time.perf_counter()
        scheduled, self._deferred = self._deferred or self._schedule(), None
        if (self._inflight is not None
                and self.runner.programs.will_build(scheduled[0])):
            self._deferred = scheduled
            return outputs + self._finish_inflight()
        inflight = self._dispatch(*scheduled, t0)
        outputs += self._take_read_early() + self._finish_inflight()
        if inflight is not None and overlap:
            self._inflight = inflight
        elif inflight is not None:
            outputs += self._finish(inflight)
        return outputs

    def _overlap_ok(self) -> bool:
        """Whether the next step may be scheduled before the last one's
        tokens are read: not when a request's inputs depend on every token
        (Request.needs_known_tokens)."""
        if not self.args.async_scheduling:
            return False
        if self.speculative is not None and not self._speculation_overlaps():
            return False
        return not any(r.needs_known_tokens for r in self.scheduler.running)

    def _speculation_overlaps(self) -> bool:
        """Whether a speculative engine may schedule ahead: its drafter
        proposes on the device (n-gram lookup reads every token on the
        host), and every running request has the pages for a whole
        verifying step past the one in flight, so that scheduling ahead
        preempts nobody (a step in flight counts all its drafts as
        accepted: spec_decode/overlap.py)."""
        spec = self.speculative
        return (spec is not None and spec.uses_draft_model
                and self.scheduler.running_fit(spec.num_speculative_tokens + 1))

    def _schedule(self) -> tuple[SchedulerOutput, int]:
        """The next step, and how many requests its scheduling preempted."""
        preempted_before = self.scheduler.num_preemptions
        sched_out = self.scheduler.schedule()
        if self.lora_store is not None:  # their adapters may be evicted now
            self.lora_store.release(sched_out.finished_ids)
        return sched_out, self.scheduler.num_preemptions - preempted_before

    def _dispatch(self, sched_out: SchedulerOutput, preempted: int,
                  t0: float) -> InFlightStep | None:
        """Enqueues a scheduled step (None: nothing to do). ``t0``: when
        the engine began on it, for the step timeline."""
        if sched_out.is_empty:
            return None
        self.num_steps += 1
        self.last_step_tokens = sched_out.num_scheduled_tokens
        timeline = self.timeline if sched_out.scheduled else None
        compile_before = CompileClock.read() if timeline else (0.0, 0)
        inflight = self.runner.dispatch(
            sched_out, functools.partial(self._fill_token_masks, sched_out))
        if timeline is not None:
            pool = self.scheduler.kv.pool
            timeline.dispatched(
                inflight, time.perf_counter() - t0, compile_before, preempted,
                (pool.num_blocks - 1 - pool.num_free,
                 self.scheduler.num_running, self.scheduler.num_waiting))
        return inflight

    def _finish_inflight(self) -> list[RequestOutput]:
        """Reads the step in flight, if any."""
        inflight, self._inflight = self._inflight, None
        return [] if inflight is None else self._finish(inflight)

    def _finish(self, inflight: InFlightStep) -> list[RequestOutput]:
        """Reads a dispatched step's tokens and turns them into outputs."""
        runner_out = self.runner.collect(inflight)
        t0 = time.perf_counter()
        sched_out = inflight.out
        if self.pooler is not None:
            return self._pooled_outputs(sched_out, runner_out.pooled)
        if self.speculative is not None and not runner_out.sampled:
            # A verifying step (a draftless decode-only step samples as a
            # plain one: its tokens come back as `sampled`).
            updated = self._take_verified(sched_out, runner_out)
        elif sched_out.num_steps > 1:
            updated = self._take_window(sched_out, runner_out.window)
        else:
            updated = self._take_tokens(sched_out, runner_out.sampled,
                                        runner_out)
        outputs = []
        for req in updated:
            out = self.parallel.merge(self.output_processor.make_output(req))
            if out is not None:
                outputs.append(out)
        if self.timeline is not None and sched_out.scheduled:
            self.timeline.collected(inflight, time.perf_counter() - t0)
        return outputs

    def _take_tokens(self, sched_out: SchedulerOutput,
                     sampled: dict[str, int],
                     logprobs_from: ModelRunnerOutput | None = None
                     ) -> list[Request]:
        """One position's tokens: appended (every stop but stop strings
        checked by the scheduler), counted, their logprobs recorded from
        ``logprobs_from``, and each request whose text reached a stop
        string finished. Returns the requests that got a token."""
        updated = self.scheduler.update_from_output(sched_out, sampled)
        self.num_generation_tokens += len(updated)
        if logprobs_from is not None:
            self.output_processor.record_logprobs(logprobs_from, updated)
        for req in updated:
            if self.output_processor.detokenize(req):
                self.scheduler.finish_requests(req.request_id,
                                               RequestStatus.FINISHED_STOPPED)
        return updated

    def _pooled_outputs(self, sched_out, pooled: dict) -> list:
        """A pooling engine's step: each prompt whose last chunk ran is
        finished, and its vector finished by its own PoolingParams."""
        pooler = self.pooler
        if pooler is None:
            raise RuntimeError("pooled outputs from a generating engine")
        outputs = []
        for req in self.scheduler.update_from_output(sched_out, {}):
            vector = pooled.get(req.request_id)
            if vector is None or req.pooling_params is None:
                raise RuntimeError(f"request {req.request_id} finished "
                                   "without its pooled vector")
            outputs.append(PoolingRequestOutput(
                req.request_id,
                PoolingOutput(finish_pooled(vector, req.pooling_params, pooler)),
                req.prompt_token_ids, True,
                metrics=RequestMetrics(req.arrival_time,
                                       req.first_scheduled_time,
                                       finished_time=req.finished_time)))
        return outputs

    def _take_window(self, sched_out, sampled: dict[str, list[int]]) -> list:
        """A multi-step decode's tokens, one step at a time, exactly as that
        many single steps would take them: each token appended, its stops
        (EOS, stop ids, max_tokens, stop strings) checked, and the tokens a
        request sampled after its stop dropped. Returns each request that
        got a token, once, in row order."""
        seen: dict[str, Request] = {}
        for i in range(sched_out.num_steps):
            for req in self._take_tokens(
                    sched_out, {rid: toks[i] for rid, toks in sampled.items()}):
                seen[req.request_id] = req
        return list(seen.values())

    def _take_verified(self, sched_out: SchedulerOutput,
                       runner_out: ModelRunnerOutput) -> list[Request]:
        """A speculative step's tokens (each row's accepted drafts and one
        more), one position at a time as single steps would take them:
        appended, logprobs recorded, every stop checked, tokens after a
        stop dropped; then rejected drafts give their pages back. Returns
        each request that got a token, once."""
        verified = runner_out.verified
        seen: dict[str, Request] = {}
        width = max((len(t) for t in verified.values()), default=0)
        for i in range(max(width, 1)):  # once at least: prompt logprobs
            step = ModelRunnerOutput(
                {rid: toks[i] for rid, toks in verified.items()
                 if len(toks) > i},
                logprobs={rid: rows.slice(i, i + 1) for rid, rows in
                          runner_out.logprobs.items() if len(rows) > i},
                prompt_logprobs=runner_out.prompt_logprobs if i == 0 else {})
            for req in self._take_tokens(sched_out, step.sampled, step):
                seen[req.request_id] = req
        self.scheduler.reject_drafts(
            sched_out, {rid: len(toks) for rid, toks in verified.items()})
        if self.spec_stats is not None:
            for sr in sched_out.scheduled:
                toks = verified.get(sr.request_id)
                # Rows of requests that ended before this step was read
                # (a step laid out ahead) emitted nothing.
                if (sr.num_draft_tokens and toks is not None
                        and sr.request_id in seen):
                    self.spec_stats.record(sr.num_draft_tokens, len(toks) - 1)
        return list(seen.values())

    def close(self) -> None:
        """Ends the engine's background work: the step programs queued to
        build ahead and not started are cancelled (an ending process
        would otherwise compile each before it exits). The engine still
        serves; later steps compile what they need."""
        programs = getattr(self.runner, "programs", None)
        if programs is not None:
            programs.build_ahead.close()

    def get_stats(self) -> EngineStats:
        s, kv = self.scheduler, self.scheduler.kv
        return EngineStats(
            num_running=s.num_running, num_waiting=s.num_waiting,
            num_swapped=s.num_swapped, kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            prefix_cache_hit_rate=kv.prefix_cache_hit_rate,
            num_preemptions=s.num_preemptions, num_swap_outs=s.num_swap_outs,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
            num_steps=self.num_steps, last_step_tokens=self.last_step_tokens,
            spec_decode=(None if self.spec_stats is None else
                         dataclasses.replace(self.spec_stats, accepted_per_pos=list(
                             self.spec_stats.accepted_per_pos))),
            **self._program_stats())

    def _program_stats(self) -> dict:
        programs = getattr(self.runner, "programs", None)
        if programs is None:  # a remote runner's programs are not here
            return {}
        seconds, count = CompileClock.read()
        return dict(num_step_programs=programs.num_programs,
                    num_known_step_programs=len(programs.known_keys() or ()),
                    num_compiles=count, compile_seconds=seconds)

    # -- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ----------

    def _lora(self, what: str) -> AdapterStore:
        if self.lora_store is None:
            raise LoRANotEnabledError(
                f"{what} needs LoRA: start the engine with enable_lora=True "
                "(--enable-lora)")
        return self.lora_store

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Reads and checks an adapter and keeps it in host memory for the
        requests that will name it; raises the typed LoRA errors. Safe to
        call from any thread."""
        self._lora("add_lora").load(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forgets an adapter; requests in flight finish with it."""
        return self._lora("remove_lora").remove(lora_int_id)

    def pin_lora(self, lora_int_id: int) -> bool:
        """Keeps an adapter in host memory whatever the LRU says."""
        return self._lora("pin_lora").pin(lora_int_id)

    def list_loras(self) -> set[int]:
        return self._lora("list_loras").ids()

    def reset_prefix_cache(self) -> None:
        """Forgets every cached prefix block that no request holds."""
        self.scheduler.kv.pool.reset_prefix_cache()
