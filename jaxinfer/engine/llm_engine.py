"""`LLMEngine`: add_request / step / abort_request over scheduler + runner."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax

from jaxinfer.models import resolve_dtype, resolve_model

from ..config import EngineArgs
from ..core.scheduler import Scheduler
from ..errors import InvalidRequestError
from ..outputs import RequestOutput
from ..request import Request, RequestStatus
from ..sampling_params import SamplingParams
from ..tokenizer import load_tokenizer
from ..worker.model_runner import ModelRunner
from .output_processor import OutputProcessor

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # share of usable pages held
    num_preemptions: int  # since start


class LLMEngine:
    def __init__(self, args: EngineArgs):
        self.args = args
        self.files = resolve_model(args.model)
        self.model_config = self.files.config
        on_cpu = jax.default_backend() == "cpu"
        self.cache_config = args.cache_config()
        self.scheduler_config = args.scheduler_config(
            self.model_config.max_position_embeddings, on_cpu)
        self.dtype = resolve_dtype(args.dtype, self.model_config)
        self.tokenizer = load_tokenizer(self.files.tokenizer)
        self.runner = ModelRunner(self.files, self.dtype, self.scheduler_config,
                                  self.cache_config, seed=args.seed,
                                  attention_backend=args.attention_backend,
                                  tensor_parallel_size=args.tensor_parallel_size,
                                  max_logprobs=args.max_logprobs)
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config,
                                   self.runner.num_blocks)
        self.output_processor = OutputProcessor(self.tokenizer)
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))
        self._counter = 0

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        return cls(args)

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    # -- requests ---------------------------------------------------------

    def _tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise InvalidRequestError(
                    "a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(
                isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise InvalidRequestError(
            f"a prompt must be a string, a list of token ids or a dict, got "
            f"{type(prompt).__name__}")

    def add_request(self, request_id: str | None, prompt: Any,
                    params: SamplingParams | None = None,
                    arrival_time: float | None = None,
                    priority: int = 0) -> str:
        """Validates and queues a request; raises InvalidRequestError (a
        ValueError) without touching the requests in flight."""
        params = params or SamplingParams()
        if request_id is None:
            request_id = str(self._counter)
        self._counter += 1
        text, ids = self._tokenize(prompt)
        if not ids:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens, but max_model_len is "
                f"{self.max_model_len}: shorten the prompt to at most "
                f"{self.max_model_len - 1} tokens or raise max_model_len")
        max_logprobs = self.args.max_logprobs
        for field in ("logprobs", "prompt_logprobs"):
            value = getattr(params, field)
            if value is not None and value > max_logprobs:
                raise InvalidRequestError(
                    f"{field} must be <= max_logprobs ({max_logprobs}), got {value}")
        try:
            params.verify_for_model(self.model_config.vocab_size, max_logprobs)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        params.update_from_tokenizer(self.tokenizer)  # bad_words -> ids
        req = Request(request_id, ids, params, self.eos_token_ids,
                      arrival_time=arrival_time, priority=priority, prompt=text,
                      max_model_len=self.max_model_len)
        self.scheduler.add_request(req)
        self.output_processor.add_request(req)
        return request_id

    def abort_request(self, request_ids) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the loop ---------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        sched_out = self.scheduler.schedule()
        if sched_out.is_empty:
            return []
        requests = self.scheduler.requests
        runner_out = self.runner.execute_model(sched_out, requests)
        updated = self.scheduler.update_from_output(sched_out, runner_out.sampled)
        self.output_processor.record_logprobs(runner_out, updated)
        outputs = []
        for req in updated:
            if self.output_processor.detokenize(req):
                self.scheduler.finish_requests(req.request_id,
                                               RequestStatus.FINISHED_STOPPED)
            out = self.output_processor.make_output(req)
            if out is not None:
                outputs.append(out)
        return outputs

    def get_stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(num_running=s.num_running, num_waiting=s.num_waiting,
                           kv_cache_usage=s.kv.usage,
                           num_preemptions=s.num_preemptions)
