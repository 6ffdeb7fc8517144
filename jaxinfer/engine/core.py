"""`EngineCore`: the engine half of a multi-process server, free of any
transport. It owns the engine (an `LLMEngine`, a `DataParallelEngine` or a
`RayEngine`, as `LLMEngine.from_engine_args` builds it), knows which front
end owns each request, and turns a step's `RequestOutput`s into each front
end's `CoreOutput`s. It also keeps the server's Prometheus metrics: it sees
every request of every front end, so one registry holds them all and
`/metrics` on any front end reads the same values.

One thread (the core process's loop) calls everything here, except
`load_adapter`, which reads an adapter from disk on a worker thread.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any

from ..errors import (
    InvalidRequestError,
    ModelNotServedError,
    QueueFullError,
    RequestFailedError,
)
from ..metrics import EngineMetrics
from ..outputs import PoolingRequestOutput, RequestOutput
from ..sampling_params import RequestOutputKind
from .async_engine import _kv_cache_dtype, engine_stats
from .core_messages import (
    AddRequest,
    CoreOutput,
    RequestError,
    StopSamples,
    error_info,
    unpack_mm_inputs,
)
from .input_processor import ProcessedInput
from .parallel_sampling import child_id
from .request_timings import RequestTimings

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, engine, *, max_num_waiting: int | None,
                 metrics: EngineMetrics):
        self.engine = engine
        self.max_num_waiting = max_num_waiting
        self.metrics = metrics
        metrics.record_cache_config(engine.cache_config,
                                    engine.runner.num_blocks,
                                    _kv_cache_dtype(engine))
        self._timings = RequestTimings(metrics)
        self.record_stats()  # warm-up's programs and compiles, before any step
        self.owner: dict[str, bytes] = {}  # request id -> its front end
        # Served adapters by name (LoRARequest fields): the core gives ids,
        # so front ends loading at once never share one.
        self._loras: dict[str, dict] = {}
        self._loras_lock = threading.Lock()

    def register_loras(self, requests) -> None:
        """Adapters the engine read at start (--lora-modules)."""
        for request in requests:
            self._loras[request.lora_name] = lora_request_fields(request)

    def loras(self) -> list[dict]:
        with self._loras_lock:
            return list(self._loras.values())

    # -- requests ---------------------------------------------------------

    def num_waiting(self) -> int:
        return self.engine.scheduler.num_waiting

    def load_adapter(self, msg: AddRequest):
        """The request's LoRA adapter, read and checked (a worker thread).
        Only a served adapter: a front end that has not yet heard another
        one unload it gets a 404, not the adapter read back from disk."""
        lora = msg.lora_request
        if lora is not None:
            with self._loras_lock:
                served = self._loras.get(lora.lora_name)
            if served is None or served["lora_int_id"] != lora.lora_int_id:
                raise ModelNotServedError(
                    f"The model `{lora.lora_name}` does not exist: its LoRA "
                    "adapter was unloaded")
        return self.engine.input_processor.load_lora(lora)

    def compile_grammar(self, msg: AddRequest) -> None:
        """Compiles the request's structured-output grammar with the core's
        own compiler (a worker thread; a cache hit for a known schema)."""
        params = msg.params
        if params.structured_outputs is not None:
            grammars = self.engine.input_processor.grammars
            params.set_compiled_grammar(
                grammars.compile(params.structured_outputs))

    def add(self, frontend: bytes, msg: AddRequest, adapter=None
            ) -> RequestError | None:
        """Adds a front end's request; its error (the request alone fails)
        or None. The queue limit is checked here too: the front ends'
        counts lag by a step."""
        try:
            if (self.max_num_waiting is not None
                    and self.num_waiting() >= self.max_num_waiting):
                raise QueueFullError(
                    f"the server queue is full ({self.max_num_waiting} "
                    "requests waiting, the --max-num-waiting limit); retry later")
            params = msg.params
            params.output_kind = RequestOutputKind.DELTA
            if params.bad_words:  # not a dataclass field: not sent
                params.update_from_tokenizer(self.engine.tokenizer)
            request = ProcessedInput(msg.prompt, list(msg.prompt_token_ids),
                                     params, unpack_mm_inputs(msg.mm_inputs),
                                     adapter, pooling=msg.pooling_params)
            self.engine.add_request(msg.request_id, request,
                                    arrival_time=msg.arrival_time,
                                    priority=msg.priority)
        except Exception as e:
            if not isinstance(e, (ValueError, QueueFullError)):
                logger.exception("request %s failed while being added",
                                 msg.request_id)
                self._discard(msg.request_id)
                e = RequestFailedError(
                    f"the request failed inside the engine: {e!r}")
            elif isinstance(e, ValueError) and not isinstance(
                    e, InvalidRequestError):
                e = InvalidRequestError(str(e))
            return RequestError(msg.request_id, error_info(e))
        self.owner[msg.request_id] = frontend
        self._timings.start(msg.request_id, msg.arrival_time, params)
        return None

    def _discard(self, request_id: str) -> None:
        try:
            self.engine.abort_request([request_id])
        except Exception:  # noqa: BLE001 - nothing was left
            logger.debug("nothing to discard for %s", request_id)

    def abort(self, request_ids: list[str]) -> None:
        """Frees the pages of requests still running; others are ignored."""
        live = [rid for rid in request_ids if self.owner.pop(rid, None)]
        if live:
            self.engine.abort_request(live)
            for rid in live:
                self._timings.abort(rid)

    def stop(self, msg: StopSamples) -> None:
        """A front end ended samples on a stop string: their pages are
        freed; a whole request counts as finished, not aborted."""
        rid = msg.request_id
        if rid not in self.owner:
            return  # finished or aborted meanwhile
        if msg.indices:
            self.engine.abort_request([child_id(i, rid) for i in msg.indices])
            return
        del self.owner[rid]
        self.engine.abort_request([rid])
        self._timings.stopped(rid, time.time())

    def abort_frontend(self, frontend: bytes) -> int:
        """A front end died: its requests are aborted. Returns how many."""
        ids = [rid for rid, owner in self.owner.items() if owner == frontend]
        self.abort(ids)
        return len(ids)

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    # -- the loop ---------------------------------------------------------

    def step(self) -> dict[bytes, list[CoreOutput]]:
        """One engine step; its outputs by front end."""
        outputs = self.engine.step()
        now = time.time()
        by_frontend: dict[bytes, list[CoreOutput]] = collections.defaultdict(list)
        for out in outputs:
            frontend = self.owner.get(out.request_id)
            if frontend is None:
                continue  # aborted meanwhile
            self._timings.observe(out, now)
            if out.finished:
                del self.owner[out.request_id]
            by_frontend[frontend].append(to_core_output(out))
        return by_frontend

    def record_stats(self) -> None:
        self.metrics.record_engine_stats(engine_stats(self.engine))

    def fail_all(self) -> None:
        """Aborts every request (the core is stopping)."""
        self.abort(list(self.owner))

    # -- utility calls --------------------------------------------------------

    def call(self, method: str, args: list[Any]) -> Any:
        """A front end's utility call (core_messages.UTILITY_METHODS)."""
        if method == "render_metrics":
            return self.metrics.render()
        if method == "list_loras":
            return sorted(self.engine.list_loras())
        if method == "served_loras":
            return self.loras()
        if method == "add_lora":
            return self._add_lora(dict(args[0]))
        if method == "remove_lora":
            lora_int_id = int(args[0])
            removed = self.engine.remove_lora(lora_int_id)
            with self._loras_lock:
                self._loras = {n: f for n, f in self._loras.items()
                               if f["lora_int_id"] != lora_int_id}
            return removed
        if method == "cache_state":
            return cache_state(self.engine)
        if method == "reset_prefix_cache":
            self.engine.reset_prefix_cache()
            return None
        raise InvalidRequestError(f"unknown engine-core call {method!r}")


    def _add_lora(self, fields: dict) -> dict:
        """Reads an adapter under a new id (a worker thread); its fields."""
        from ..lora.request import LoRARequest
        name = fields["lora_name"]
        with self._loras_lock:
            if name in self._loras:
                raise InvalidRequestError(
                    f"The lora adapter '{name}' has already been loaded.")
            fields["lora_int_id"] = 1 + max(
                (f["lora_int_id"] for f in self._loras.values()), default=0)
            self._loras[name] = fields  # held while it loads
        try:
            self.engine.add_lora(LoRARequest(**fields))
        except BaseException:
            with self._loras_lock:
                self._loras.pop(name, None)
            raise
        return fields


def to_core_output(out: RequestOutput | PoolingRequestOutput) -> CoreOutput:
    """A step's output without its prompt (the front end has it)."""
    if isinstance(out, PoolingRequestOutput):
        return CoreOutput(out.request_id, [], out.finished, out.metrics,
                          pooled=[float(x) for x in out.outputs.data])
    return CoreOutput(out.request_id, out.outputs, out.finished, out.metrics,
                      out.num_cached_tokens, out.prompt_logprobs)


def cache_state(engine) -> dict[str, int]:
    """What a probe reads of an engine's KV pages and request state, summed
    over data-parallel replicas: ``free_pages`` of ``pages`` (page 0, the
    padding page, is never free), ``unfinished`` requests and ``tracked``
    requests whose output state is still kept. An idle engine that leaked
    nothing has ``free_pages == pages - 1`` per replica and both counts 0."""
    replicas = getattr(engine, "replicas", [engine])
    state = {"free_pages": 0, "pages": 0, "unfinished": 0, "tracked": 0,
             "replicas": len(replicas)}
    for replica in replicas:
        pool = replica.scheduler.kv.pool
        state["free_pages"] += pool.num_free
        state["pages"] += pool.num_blocks
        state["unfinished"] += (replica.scheduler.num_running
                                + replica.scheduler.num_waiting)
        state["tracked"] += replica.output_processor.num_requests
    return state


def lora_request_fields(lora_request) -> dict:
    """A LoRARequest as the keyword arguments that rebuild it."""
    return {k: v for k, v in dataclasses.asdict(lora_request).items()
            if v is not None and k != "lora_local_path"}
