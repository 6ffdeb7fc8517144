"""`AsyncLLMEngine`: an `LLMEngine` driven by one background thread, for
asyncio servers.

The engine is not thread-safe, so exactly one thread touches it: the loop
thread. It drains a command queue (add, abort, stop), runs ``step()`` while
work remains and hands each step's ``RequestOutput`` deltas to the asyncio
queue of their request with one ``call_soon_threadsafe`` per step. Handlers
therefore never block the loop and the loop never waits for a handler. JAX
releases the GIL while a step runs, so the event loop keeps serving HTTP.

An aborted request (client gone) is removed between two steps, which frees its
KV pages at once.

Fault isolation: a request is checked and tokenized completely by the
`InputProcessor` in a worker thread before it is queued, so neither a large
prompt nor a bad one reaches the event loop or the engine loop. Whatever one
request still raises while being added fails that request alone. An error in
``step()`` cannot be pinned on one request: the loop stops, every client
still waiting is answered at once (`EngineDeadError`), ``health()`` says why,
and the death callbacks run (the server uses one to exit non-zero so that a
supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from ..errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
    ServerShuttingDownError,
)
from ..lora.request import LoRARequest
from ..metrics import EngineMetrics
from ..outputs import RequestOutput
from ..sampling_params import RequestOutputKind, SamplingParams
from .engine_client import EngineClient, ServedModel
from .input_processor import ProcessedInput
from .llm_engine import LLMEngine
from .request_stream import ACK as _ACK
from .request_stream import DEFAULT_MAX_NUM_WAITING, RequestStream
from .request_stream import put_all as _put_all
from .request_timings import RequestTimings

__all__ = ["AsyncLLMEngine", "EngineDeadError", "QueueFullError",
           "RequestStream", "ServerShuttingDownError", "DEFAULT_MAX_NUM_WAITING"]

logger = logging.getLogger(__name__)

class AsyncLLMEngine(EngineClient):
    """The in-process `EngineClient`: a loop thread drives ``engine``."""

    def __init__(self, engine: LLMEngine, *,
                 max_num_waiting: int | None = DEFAULT_MAX_NUM_WAITING,
                 metrics: EngineMetrics | None = None):
        super().__init__()
        if max_num_waiting is not None and max_num_waiting < 0:
            raise ValueError(f"max_num_waiting must be >= 0 or None, got "
                             f"{max_num_waiting}")
        self.engine = engine
        self.max_num_waiting = max_num_waiting
        self.metrics = metrics or EngineMetrics(str(engine.args.model),
                                                max_model_len=engine.max_model_len)
        self.metrics.record_cache_config(engine.cache_config,
                                         engine.runner.num_blocks,
                                         _kv_cache_dtype(engine))
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # loop thread only
        self._timings = RequestTimings(self.metrics)  # loop thread only
        self._pending = 0  # adds queued but not yet taken by the loop
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dead_error: BaseException | None = None
        self.accepting = True  # False once shutdown began
        self._closed = False  # the loop thread has exited (under _lock)
        self._death_callbacks: list[Callable[[BaseException], None]] = []
        # An engine whose workers live elsewhere (the Ray executor) reports
        # their death even while the loop is idle: the loop then dies too.
        on_failure = getattr(engine, "on_failure", None)
        if on_failure is not None:
            on_failure(lambda error: self._commands.put(("die", error)))

    @classmethod
    def from_engine_args(cls, args, **kwargs) -> AsyncLLMEngine:
        return cls(LLMEngine.from_engine_args(args), **kwargs)

    # -- what handlers read -------------------------------------------------

    @property
    def tokenizer(self):  # type: ignore[override]
        return self.engine.tokenizer

    @property
    def input_processor(self):  # type: ignore[override]
        return self.engine.input_processor

    @property
    def model(self) -> ServedModel:  # type: ignore[override]
        """Read from the engine each time (a test may change its EOS ids)."""
        engine = self.engine
        return ServedModel(
            args=engine.args, vocab_size=engine.model_config.vocab_size,
            max_model_len=engine.max_model_len,
            max_num_seqs=engine.scheduler_config.max_num_seqs,
            eos_token_ids=tuple(engine.eos_token_ids),
            lora_enabled=getattr(engine, "lora_store", None) is not None)

    def describe(self) -> str | None:
        describe = getattr(self.engine, "describe", None)
        return describe() if describe is not None else None

    @property
    def is_running(self) -> bool:
        return (self._thread is not None and self._thread.is_alive()
                and self.dead_error is None)

    def health(self) -> str | None:
        """None when healthy, else why not (what /health reports)."""
        if self.dead_error is not None:
            return f"the engine loop stopped: {self.dead_error!r}"
        if not self.is_running:
            return "the engine loop is not running"
        return None

    def on_death(self, callback: Callable[[BaseException], None]) -> None:
        """Runs ``callback(error)`` (on the loop thread) if the loop dies."""
        self._death_callbacks.append(callback)

    def num_waiting(self) -> int:
        """Requests not yet running: queued adds plus the scheduler's waiting
        queue (read without a lock; a length is enough here)."""
        return self._pending + self.engine.scheduler.num_waiting

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._closed, self.accepting = False, True  # a restart after shutdown
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="jaxinfer-engine-loop")
            self._thread.start()

    def fail_all(self, error: BaseException) -> None:
        """Aborts every request in flight, answering each with ``error``
        (the end of a shutdown grace period). Thread-safe."""
        self._commands.put(("fail_all", error))

    def shutdown(self, timeout: float = 30.0) -> None:
        self.accepting = False
        if self._thread is not None:
            self._commands.put(("stop",))
            self._thread.join(timeout)
            self._thread = None
        self._stop_pool()
        close = getattr(self.engine, "close", None)
        if close is not None:  # queued background builds would delay exit
            close()
        stop_engine = getattr(self.engine, "shutdown", None)
        if stop_engine is not None:  # worker processes (Ray, data parallel)
            stop_engine()

    # -- requests -------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: Any,
                          params: SamplingParams | None = None,
                          arrival_time: float | None = None,
                          lora_request: LoRARequest | None = None,
                          priority: int = 0) -> RequestStream:
        """Checks and queues a request; returns its stream once the engine
        accepted it. ``prompt`` is anything `LLMEngine.add_request` takes;
        its LoRA adapter, if any, is read on a worker thread. Raises
        InvalidRequestError (400), QueueFullError or
        ServerShuttingDownError (503), or EngineDeadError (500)."""
        self.start()
        self.check_admission()
        with self._lock:
            self._pending += 1  # counts toward the queue limit from now on
        queued = False
        try:
            if not isinstance(prompt, ProcessedInput):
                prompt = await self.run_blocking(
                    self.input_processor.process, prompt, params,
                    lora_request=lora_request)
            params = prompt.params.clone()
            params.output_kind = RequestOutputKind.DELTA
            stream = RequestStream(request_id, asyncio.get_running_loop())
            arrival = time.time() if arrival_time is None else arrival_time
            with self._lock:  # the loop's last drain (_close) runs under it
                self.check_admission(count_queue=False)  # it counts us now
                if self._closed:
                    raise ServerShuttingDownError("the engine loop has stopped")
                self._commands.put(("add", stream, dataclasses.replace(
                    prompt, params=params), arrival, priority))
                queued = True
        finally:
            if not queued:
                with self._lock:
                    self._pending -= 1
        try:
            ack = await stream.get()
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        assert ack is _ACK, ack
        return stream

    def abort(self, request_id: str) -> None:
        """Thread-safe and idempotent; a finished request is left alone."""
        self._commands.put(("abort", request_id))

    # -- LoRA adapters (the store is thread-safe: no trip through the loop) --

    async def add_lora(self, lora_request: LoRARequest) -> LoRARequest:
        """Reads and checks an adapter on a worker thread; raises the typed
        LoRA errors (400, or 404 for a missing folder)."""
        await self.run_blocking(self.engine.add_lora, lora_request)
        return lora_request

    async def remove_lora(self, lora_int_id: int) -> bool:
        return self.engine.remove_lora(lora_int_id)

    async def list_loras(self) -> set[int]:
        return self.engine.list_loras()

    async def render_metrics(self) -> bytes:
        return self.metrics.render()

    # -- the loop thread --------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                commands = []
                if not engine.has_unfinished_requests():
                    commands.append(self._commands.get())  # idle: wait for work
                while True:
                    try:
                        commands.append(self._commands.get_nowait())
                    except queue.Empty:
                        break
                for cmd in commands:
                    if cmd[0] == "stop":
                        self._close(ServerShuttingDownError(
                            "the server shut down before this request finished"))
                        return
                    if cmd[0] == "die":
                        raise cmd[1]
                    if cmd[0] == "add":
                        self._do_add(*cmd[1:])
                    elif cmd[0] == "fail_all":
                        self._fail_streams(cmd[1])
                    else:
                        self._do_abort(cmd[1])
                if engine.has_unfinished_requests():
                    self._dispatch(engine.step())
                self.metrics.record_engine_stats(engine_stats(engine))
        except BaseException as e:  # a bug: fail every request, loudly
            logger.exception("engine loop stopped")
            self._die(e)

    def _die(self, error: BaseException) -> None:
        """Answers every client at once, then tells the death callbacks."""
        self.dead_error = error
        self._close(EngineDeadError(self.health()))
        for callback in self._death_callbacks:
            try:
                callback(error)
            except Exception:
                logger.exception("engine death callback failed")

    def _close(self, error: BaseException) -> None:
        """The loop's last act: every stream and every queued add gets
        ``error``. Under the lock, after which add_request refuses, so no add
        is queued after this drain and left unanswered."""
        with self._lock:
            self._closed = True
            self._deliver([(s, error) for s in self._streams.values()])
            self._streams.clear()
            while True:
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    break
                if cmd[0] == "add":
                    self._pending -= 1
                    self._deliver([(cmd[1], error)])

    def _fail_streams(self, error: BaseException) -> None:
        ids = list(self._streams)
        if ids:
            self.engine.abort_request(ids)
        self._deliver([(s, error) for s in self._streams.values()])
        self._streams.clear()
        self._timings.clear()

    def _do_add(self, stream: RequestStream, request: ProcessedInput,
                arrival: float, priority: int = 0) -> None:
        with self._lock:
            self._pending -= 1
        try:
            self.engine.add_request(stream.request_id, request,
                                    arrival_time=arrival, priority=priority)
        except Exception as e:
            if not isinstance(e, ValueError):
                logger.exception("request %s failed while being added",
                                 stream.request_id)
                self._discard(stream.request_id)
                e = RequestFailedError(
                    f"the request failed inside the engine: {e!r}")
            elif not isinstance(e, InvalidRequestError):
                e = InvalidRequestError(str(e))
            self._deliver([(stream, e)])
            return
        self._streams[stream.request_id] = stream
        self._timings.start(stream.request_id, arrival, request.params)
        self._deliver([(stream, _ACK)])

    def _discard(self, request_id: str) -> None:
        """Removes whatever a failed add left behind in the engine."""
        try:
            self.engine.abort_request([request_id])
        except Exception:  # noqa: BLE001 - nothing was left
            logger.debug("nothing to discard for %s", request_id)

    def _do_abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is None:
            return  # finished already, or never accepted
        self.engine.abort_request([request_id])
        self._timings.abort(request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = time.time()
        items = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            self._timings.observe(out, now)
            if out.finished:
                del self._streams[out.request_id]
            items.append((stream, out))
        self._deliver(items)

    @staticmethod
    def _deliver(items) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, item in items:
            by_loop.setdefault(stream.loop, []).append((stream, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that event loop is closed: nobody listens
                pass


def engine_stats(engine):
    """The engine's stats, with the prefix-cache totals read from the KV
    manager when ``get_stats`` does not carry them."""
    stats = engine.get_stats()
    if getattr(stats, "prefix_cache_queries", None) is None:
        kv = engine.scheduler.kv
        stats = types.SimpleNamespace(
            **vars(stats),
            prefix_cache_queries=getattr(kv, "prefix_cache_queries", None),
            prefix_cache_hits=getattr(kv, "prefix_cache_hits", None))
    return stats


def _kv_cache_dtype(engine) -> str:
    """The KV pages' dtype (read from worker 0 when the pages live there)."""
    remote = getattr(engine.runner, "kv_cache_dtype", None)
    return remote if remote is not None else str(engine.runner.kv_pages[0][0].dtype)

