"""`LLMEngine`: add_request / step / abort_request over scheduler + runner."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import jax

from jaxinfer.models import resolve_dtype, resolve_model, resolve_tokenizer

from ..config import EngineArgs, derived_max_model_len
from ..core.scheduler import Scheduler
from ..distributed.parallel_config import check_fits
from ..distributed.step_broadcast import runner_class
from ..errors import InvalidConfigError, InvalidRequestError
from ..lora.errors import LoRANotEnabledError
from ..lora.request import LoRARequest
from ..multimodal.processor import make_image_processor
from ..outputs import RequestOutput
from ..request import Request, RequestStatus
from ..sampling_params import SamplingParams
from ..tokenizer import load_tokenizer
from ..worker.executable_cache import executable_cache_for
from ..worker.warmup import enable_compilation_cache, warm_up
from .input_processor import InputProcessor, ProcessedInput
from .output_processor import OutputProcessor
from .parallel_sampling import ParallelSampling
from .step_timeline import CompileClock, StepRecord, StepTimeline, step_shape

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


class LLMEngine:
    def __init__(self, args: EngineArgs, devices=None):
        """One replica over ``devices`` (default: every device; a
        data-parallel front gives each replica its own)."""
        self.args = args
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
        self.lora_config = args.lora_config()  # None: LoRA off
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
            build_first=not args.warmup)
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
            max_loras=self.lora_config.max_loras if self.lora_config else None)
        self.image_processor = make_image_processor(
            self.files, args, self.tokenizer)  # None: the model takes text only
        self.warmup_programs, self.warmup_seconds = (
            warm_up(self.runner, executables=executable_cache_for(
                self.runner, self.compilation_cache_dir))
            if args.warmup else (0, 0.0))
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
        self._inflight = None  # a dispatched step whose tokens are unread
        # (SchedulerOutput, preemptions) scheduled but not yet dispatched:
        # step() returned the step in flight's tokens first (see step()).
        self._deferred = None

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
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
            lora_store=self.lora_store)

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
        adapter = prompt.lora
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
                      lora_request=None if adapter is None else adapter.request)
        for r in self.parallel.add(req):  # n > 1: n ordinary requests
            if adapter is not None:  # held in host memory until it finishes
                self.lora_store.acquire(r.request_id, adapter)
            self.scheduler.add_request(r)
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

    def _overlap_ok(self) -> bool:
        """Whether the next step may be scheduled before the last one's
        tokens are read: not when a request's inputs depend on every token
        (Request.needs_known_tokens)."""
        if not self.args.async_scheduling:
            return False
        return not any(r.needs_known_tokens for r in self.scheduler.running)

    def step(self) -> list[RequestOutput]:
        """One engine step. With overlap (async_scheduling), step N+1 is
        scheduled and enqueued before step N's tokens are read, so the
        device never waits on the host; those tokens feed N+1 on the
        device, and a request that stopped at N drops its N+1 token."""
        outputs: list[RequestOutput] = []
        overlap = self._overlap_ok()
        if self._inflight is not None and not overlap:
            outputs += self._finish(self._inflight)
            self._inflight = None
        t0 = time.perf_counter()
        if self._deferred is not None:  # scheduled by the last call
            (sched_out, preempted), self._deferred = self._deferred, None
        else:
            preempted_before = self.scheduler.num_preemptions
            sched_out = self.scheduler.schedule()
            preempted = self.scheduler.num_preemptions - preempted_before
            if self.lora_store is not None:  # their adapters may be evicted now
                self.lora_store.release(sched_out.finished_ids)
            if (self._inflight is not None
                    and self.runner.builds_program(sched_out)):
                # Building the step's program (tracing, then compiling or
                # reading the compilation cache) takes far longer than the
                # step in flight: return that step's tokens now, and
                # dispatch this one on the next call. A new request's first
                # token would otherwise wait for the first decode program
                # (about 0.5 s on CPU, from the cache).
                self._deferred = (sched_out, preempted)
                outputs += self._finish(self._inflight)
                self._inflight = None
                return outputs
        inflight = None
        if not sched_out.is_empty:
            self.num_steps += 1
            self.last_step_tokens = sched_out.num_scheduled_tokens
            compile_before = CompileClock.read() if self.timeline else None
            # A first request other than start_first's guess: the guess's
            # queued builds would only compete with this step's own.
            self.runner.build_ahead.drop_missed_first(sched_out)
            inflight = self.runner.dispatch(sched_out)
            # The decode bucket after this step builds in the background
            # while it runs, when not built yet (worker/build_ahead.py).
            self.runner.build_ahead.request(sched_out)
            inflight.host_s = time.perf_counter() - t0
            if compile_before is not None:  # compiles of this dispatch alone
                after = CompileClock.read()
                inflight.compiled = (after[0] - compile_before[0],
                                     after[1] - compile_before[1])
            inflight.preempted = preempted
            pool = self.scheduler.kv.pool
            inflight.queue = (pool.num_blocks - 1 - pool.num_free,
                              self.scheduler.num_running,
                              self.scheduler.num_waiting)
        if self._inflight is not None:
            outputs += self._finish(self._inflight)
        self._inflight = None
        if inflight is not None:
            if overlap:
                self._inflight = inflight
            else:
                outputs += self._finish(inflight)
        return outputs

    def _finish(self, inflight) -> list[RequestOutput]:
        """Reads a dispatched step's tokens and turns them into outputs."""
        runner_out = self.runner.collect(inflight)
        t0 = time.perf_counter()
        sched_out = inflight.out
        if sched_out.num_steps > 1:
            updated = self._take_window(sched_out, runner_out.sampled)
        else:
            updated = self.scheduler.update_from_output(sched_out,
                                                        runner_out.sampled)
            self.num_generation_tokens += len(updated)
            self.output_processor.record_logprobs(runner_out, updated)
            for req in updated:
                if self.output_processor.detokenize(req):
                    self.scheduler.finish_requests(req.request_id,
                                                   RequestStatus.FINISHED_STOPPED)
        outputs = []
        for req in updated:
            out = self.parallel.merge(self.output_processor.make_output(req))
            if out is not None:
                outputs.append(out)
        if self.timeline is not None and sched_out.scheduled:
            inflight.host_s += time.perf_counter() - t0
            self._record_step(inflight)
        return outputs

    def _take_window(self, sched_out, sampled: dict[str, list[int]]) -> list:
        """A multi-step decode's tokens, one step at a time, exactly as that
        many single steps would take them: each token appended, its stops
        (EOS, stop ids, max_tokens, stop strings) checked, and the tokens a
        request sampled after its stop dropped. Returns each request that
        got a token, once, in row order."""
        seen: dict[str, Request] = {}
        for i in range(sched_out.num_steps):
            updated = self.scheduler.update_from_output(
                sched_out, {rid: toks[i] for rid, toks in sampled.items()})
            self.num_generation_tokens += len(updated)
            for req in updated:
                if self.output_processor.detokenize(req):
                    self.scheduler.finish_requests(req.request_id,
                                                   RequestStatus.FINISHED_STOPPED)
                seen[req.request_id] = req
        return list(seen.values())

    def _record_step(self, inflight) -> None:
        compile_s, compiles = inflight.compiled
        T, S, P, decode_only = inflight.dims
        compile_ms = 1e3 * compile_s
        self.timeline.add(StepRecord(
            step=len(self.timeline.records),
            t_start_s=inflight.dispatched_at - self.timeline._t0, T=T, S=S,
            P=P, decode_only=decode_only, **step_shape(inflight.out.scheduled),
            host_ms=max(1e3 * inflight.host_s - compile_ms, 0.0),
            device_ms=1e3 * (inflight.ready_at - inflight.device_start),
            compile_ms=compile_ms,
            compiles=compiles,
            preempted=inflight.preempted, pages_in_use=inflight.queue[0],
            running=inflight.queue[1], waiting=inflight.queue[2],
            num_steps=inflight.out.num_steps))

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
            num_steps=self.num_steps, last_step_tokens=self.last_step_tokens)

    # -- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ----------

    def _lora(self, what: str):
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
