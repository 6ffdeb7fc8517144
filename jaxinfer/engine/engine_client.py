"""`EngineClient`: what a server's handlers use of an engine, whether the
engine runs in this process (`AsyncLLMEngine`, a loop thread over an
`LLMEngine`, a `DataParallelEngine` or a `RayEngine`) or in an engine-core
process of its own (`MPEngineClient`, over ZMQ). `make_client` picks one.

The handlers tokenize, render chat templates and check requests with the
client's `InputProcessor` (on a worker thread: `run_blocking`), add
requests and read each one's DELTA outputs from its `RequestStream`. This
module imports no JAX: a front-end process holds only clients.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import dataclasses
import functools
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import EngineDeadError, QueueFullError, ServerShuttingDownError
from ..lora.request import LoRARequest
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .request_stream import RequestStream

# Threads that tokenize, render chat templates and detokenize off the loop.
PREPROCESS_THREADS = 2


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What handlers need to know of the model an engine serves."""
    args: Any  # the engine's EngineArgs
    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    eos_token_ids: tuple[int, ...]
    lora_enabled: bool  # --enable-lora: adapters may be loaded


class EngineClient(abc.ABC):
    """The engine as a server sees it. Thread-safety: every method is called
    from the server's event loop, except ``abort`` and ``fail_all`` (any
    thread)."""

    model: ServedModel
    tokenizer: Any
    input_processor: Any  # jaxinfer.engine.input_processor.InputProcessor
    max_num_waiting: int | None
    accepting: bool  # False once shutdown began
    dead_error: BaseException | None  # why the engine died; None: alive

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    # -- lifecycle ------------------------------------------------------------

    @abc.abstractmethod
    def start(self) -> None:
        """Starts delivering outputs (idempotent)."""

    @abc.abstractmethod
    def shutdown(self, timeout: float = 30.0) -> None:
        """Stops; requests still open get ServerShuttingDownError."""

    def stop_accepting(self) -> None:
        """New requests get ServerShuttingDownError; running ones go on."""
        self.accepting = False

    @abc.abstractmethod
    def fail_all(self, error: BaseException) -> None:
        """Aborts every request in flight, answering each with ``error``."""

    @abc.abstractmethod
    def on_death(self, callback: Callable[[BaseException], None]) -> None:
        """Runs ``callback(error)`` once if the engine dies."""

    @abc.abstractmethod
    def health(self) -> str | None:
        """None when healthy, else why not (what /health reports)."""

    def describe(self) -> str | None:
        """Where the engine's workers run, when that is worth printing."""
        return None

    # -- admission ------------------------------------------------------------

    @abc.abstractmethod
    def num_waiting(self) -> int:
        """Requests not yet running (a recent count is enough)."""

    def queue_full(self) -> bool:
        return (self.max_num_waiting is not None
                and self.num_waiting() >= self.max_num_waiting)

    def check_admission(self, count_queue: bool = True) -> None:
        """Raises EngineDeadError, ServerShuttingDownError or QueueFullError
        when a new request cannot be taken now."""
        if self.dead_error is not None:
            raise EngineDeadError(self.health())
        if not self.accepting:
            raise ServerShuttingDownError(
                "the server is shutting down and takes no new requests; "
                "retry on another replica or after the restart")
        if count_queue and self.queue_full():
            raise QueueFullError(
                f"the server queue is full ({self.max_num_waiting} requests "
                f"waiting, the --max-num-waiting limit); retry later")

    async def run_blocking(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on a worker thread: tokenizing, rendering
        or detokenizing a large input must not stall the event loop."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    PREPROCESS_THREADS, thread_name_prefix="jaxinfer-preprocess")
            pool = self._pool
        return await asyncio.get_running_loop().run_in_executor(
            pool, functools.partial(fn, *args, **kwargs))

    def _stop_pool(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    # -- requests -------------------------------------------------------------

    @abc.abstractmethod
    async def add_request(self, request_id: str, prompt: Any,
                          params: SamplingParams | None = None,
                          arrival_time: float | None = None,
                          lora_request: LoRARequest | None = None,
                          priority: int = 0) -> RequestStream:
        """Checks and queues a request; returns its stream once the engine
        accepted it. Raises InvalidRequestError (400), QueueFullError or
        ServerShuttingDownError (503), or EngineDeadError (500)."""

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Thread-safe and idempotent; a finished request is left alone."""

    async def generate(self, prompt: Any, params: SamplingParams,
                       request_id: str,
                       arrival_time: float | None = None, priority: int = 0,
                       lora_request: LoRARequest | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Yields the request's DELTA outputs; the last one has
        ``finished=True``. Leaving early (cancel, close) aborts the request."""
        stream = await self.add_request(request_id, prompt, params, arrival_time,
                                        lora_request=lora_request,
                                        priority=priority)
        async for out in self.iterate(stream):
            yield out

    async def iterate(self, stream: RequestStream) -> AsyncIterator[RequestOutput]:
        """The outputs of an added request; leaving early aborts it."""
        try:
            while True:
                out = await stream.get()
                yield out
                if out.finished:
                    return
        finally:
            if not stream.finished:
                self.abort(stream.request_id)

    # -- LoRA adapters and monitoring -------------------------------------------

    @abc.abstractmethod
    async def add_lora(self, lora_request: LoRARequest) -> LoRARequest:
        """Reads and checks an adapter; raises the typed LoRA errors.
        Returns the request as the engine serves it (an engine-core
        process gives the id, unique across its front ends)."""

    def watch_loras(  # noqa: B027 - optional: one front end has nothing to watch
            self, callback: Callable[[list[LoRARequest]], None]) -> None:
        """``callback(every served adapter)`` after another front end of
        the same engine loaded or removed one (none here: one front end)."""

    async def served_loras(self) -> list[LoRARequest] | None:
        """Every adapter the engine serves now, asked of it (None: this is
        the engine's only front end, whose own list is always current)."""
        return None

    @abc.abstractmethod
    async def remove_lora(self, lora_int_id: int) -> bool:
        """Forgets an adapter; requests in flight finish with it."""

    @abc.abstractmethod
    async def list_loras(self) -> set[int]:
        ...

    @abc.abstractmethod
    async def render_metrics(self) -> bytes:
        """The engine's Prometheus metrics, text exposition format."""


def make_client(engine_args, *, core_address: str | None = None,
                **options) -> EngineClient:
    """The client for ``engine_args``: with ``core_address`` a front end of
    the engine-core process listening there (``options``: `MPEngineClient`'s,
    the handshake's `CoreInfo` first); else an engine in this process
    (`AsyncLLMEngine`: one replica, a data-parallel front or a Ray driver,
    as ``engine_args`` say)."""
    if core_address is not None:
        from .mp_client import MPEngineClient
        return MPEngineClient(core_address, **options)
    from .async_engine import AsyncLLMEngine
    return AsyncLLMEngine.from_engine_args(engine_args, **options)
