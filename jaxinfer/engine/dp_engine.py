"""`DataParallelEngine`: ``data_parallel_size`` engine replicas on disjoint
devices behind one front.

Each replica is a whole `LLMEngine` (its own scheduler, KV pool and params,
over ``tensor_parallel_size x pipeline_parallel_size`` devices of its own).
The front offers the `LLMEngine` surface that `LLM` and `AsyncLLMEngine`
use, so the offline API and the server run over it unchanged: a request
goes to the replica `DataParallelRouter` picks and stays there; ``step``
steps every replica with work. With async scheduling each replica's step
enqueues its next program before waiting for its last, so while the front
waits on one replica the others' devices are running.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxinfer.models import resolve_model

from ..distributed.parallel_config import check_fits
from ..errors import InvalidRequestError
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from ..spec_decode.stats import SpecDecodeStats
from .dp_router import DataParallelRouter
from .input_processor import ProcessedInput
from .parallel_sampling import parent_id


class DataParallelEngine:
    def __init__(self, engine_cls, args):
        self.args = args
        parallel = args.parallel_config()
        devices = jax.devices()
        # Every size checked against the model and the devices before the
        # first replica loads anything.
        check_fits(parallel, resolve_model(args.model, args.load_format).config,
                   len(devices), jax.default_backend(),
                   args.resolved_preemption()[0])
        size = parallel.replica_size
        self.replicas = [
            engine_cls(_replica_args(args, i),
                       devices=devices[i * size:(i + 1) * size])
            for i in range(parallel.data_parallel_size)]
        first = self.replicas[0]
        self.router = DataParallelRouter(
            len(self.replicas), first.cache_config.block_size,
            max_imbalance=first.scheduler_config.max_num_seqs)
        self.owner: dict[str, int] = {}  # request id -> its replica
        self.scheduler = _Schedulers(self.replicas)
        self._counter = 0

    # -- what every replica shares (the same args, model and sizes) --------

    def __getattr__(self, name: str) -> Any:
        if name in _SHARED:
            return getattr(self.replicas[0], name)
        raise AttributeError(name)

    @property
    def warmup_programs(self) -> int:
        return sum(r.warmup_programs for r in self.replicas)

    @property
    def warmup_seconds(self) -> float:
        return sum(r.warmup_seconds for r in self.replicas)

    @property
    def replica_request_counts(self) -> list[int]:
        """Requests routed to each replica since start."""
        return list(self.router.assigned)

    # -- requests ---------------------------------------------------------

    def add_request(self, request_id: str | None, prompt: Any,
                    params: SamplingParams | None = None,
                    arrival_time: float | None = None,
                    priority: int = 0) -> str:
        if not isinstance(prompt, ProcessedInput):
            prompt = self.input_processor.process(prompt, params)
        if request_id is None:
            request_id = str(self._counter)  # unique across the replicas
        elif request_id in self.owner:
            raise InvalidRequestError(
                f"request id {request_id!r} is already in flight: use a new id")
        loads = [r.scheduler.num_running + r.scheduler.num_waiting
                 for r in self.replicas]
        cached = [lambda h, r=r: r.scheduler.kv.pool.lookup(h) is not None
                  for r in self.replicas]
        i = self.router.choose(prompt.prompt_token_ids, loads, cached)
        self.replicas[i].add_request(request_id, prompt,
                                     arrival_time=arrival_time,
                                     priority=priority)
        self._counter += 1
        self.owner[request_id] = i
        return request_id

    def abort_request(self, request_ids) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        by_replica: dict[int, list[str]] = {}
        for rid in request_ids:
            i = self.owner.pop(rid, None)
            if i is None:  # one sample of a running n > 1 request
                parent = parent_id(rid)
                i = None if parent is None else self.owner.get(parent)
            if i is not None:
                by_replica.setdefault(i, []).append(rid)
        for i, ids in by_replica.items():
            self.replicas[i].abort_request(ids)

    def has_unfinished_requests(self) -> bool:
        return any(r.has_unfinished_requests() for r in self.replicas)

    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        for replica in self.replicas:
            if replica.has_unfinished_requests():
                outputs += replica.step()
        for out in outputs:
            if out.finished:
                self.owner.pop(out.request_id, None)
        return outputs

    def get_stats(self):
        """The replicas' stats summed (usage: their mean)."""
        stats = [r.get_stats() for r in self.replicas]
        total = {f.name: sum(getattr(s, f.name) for s in stats)
                 for f in dataclasses.fields(stats[0])
                 if f.name != "spec_decode"}
        total["spec_decode"] = SpecDecodeStats.merged(
            [s.spec_decode for s in stats])
        total["kv_cache_usage"] /= len(stats)
        queries = total["prefix_cache_queries"]
        total["prefix_cache_hit_rate"] = (total["prefix_cache_hits"] / queries
                                          if queries else 0.0)
        return type(stats[0])(**total)

    def reset_prefix_cache(self) -> None:
        for r in self.replicas:
            r.reset_prefix_cache()


def _replica_args(args, index: int):
    """Replica ``index``'s args: one replica; its own step timeline file."""
    timeline = args.profile_steps and f"{args.profile_steps}.replica{index}"
    return dataclasses.replace(args, data_parallel_size=1,
                               profile_steps=timeline or None)


# Read from replica 0: the same on every replica.
_SHARED = frozenset({
    "files", "model_config", "cache_config", "scheduler_config",
    "parallel_config", "dtype", "tokenizer", "input_processor",
    "max_model_len", "max_logprobs", "eos_token_ids", "runner", "timeline",
    "compilation_cache_dir"})


class _Schedulers:
    """The replicas' queue lengths summed (what the server's queue limit
    and metrics read)."""

    def __init__(self, replicas):
        self._replicas = replicas

    @property
    def num_running(self) -> int:
        return sum(r.scheduler.num_running for r in self._replicas)

    @property
    def num_waiting(self) -> int:
        return sum(r.scheduler.num_waiting for r in self._replicas)

    def has_unfinished_requests(self) -> bool:
        return any(r.scheduler.has_unfinished_requests() for r in self._replicas)
