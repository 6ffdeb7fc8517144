"""`MPEngineClient`: the `EngineClient` of an HTTP front-end process, over
ZMQ to the engine-core process (`core_process.py`). Free of JAX.

The front end checks and tokenizes each request with its own
`InputProcessor` (the same checks `LLM.generate` makes), sends it whole,
and reads the core's `CoreOutputs` on one asyncio task that makes each
request's text from the core's token ids (`FrontendText`: detokenizing,
stop strings, logprob tokens; a stop string frees the request in the
core) and hands its outputs to its `RequestStream`. A request the core refused gets
its typed error (400 / 503) before any stream starts.

The core's death is seen two ways: a `dead` message (an error in a step)
or EOF on a pipe whose other end only the core process holds (killed,
crashed). Either way every open stream ends with `EngineDeadError`,
`health()` says why and the death callbacks run (the server exits 1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from ..errors import EngineDeadError, ServerShuttingDownError
from ..lora.request import LoRARequest
from ..outputs import PoolingOutput, PoolingRequestOutput, RequestOutput
from ..sampling_params import RequestOutputKind, SamplingParams
from .core_info import CoreInfo, frontend_identity
from .core_messages import (
    AbortRequests,
    AddRequest,
    Codec,
    CoreOutput,
    CoreOutputs,
    StopSamples,
    UtilityCall,
    pack_mm_inputs,
    rebuild_error,
)
from .engine_client import EngineClient
from .frontend_text import FrontendText
from .input_processor import InputProcessor, ProcessedInput
from .request_stream import ACK, DEFAULT_MAX_NUM_WAITING, RequestStream

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _ModelFiles:
    """What the image processor reads of a resolved model."""
    config: Any
    source: str


class MPEngineClient(EngineClient):
    def __init__(self, address: str, info: CoreInfo, *, index: int = 0,
                 core_alive=None,
                 max_num_waiting: int | None = DEFAULT_MAX_NUM_WAITING):
        """``core_alive``: a pipe end that reads EOF once the core process
        is gone (None: only the core's own messages tell)."""
        super().__init__()
        from ..multimodal.processor import make_image_processor
        from ..structured.grammar import GrammarCompiler
        from ..tokenizer import load_tokenizer
        self.address, self.info, self.index = address, info, index
        self.model = info.model
        self.max_num_waiting = max_num_waiting
        self.tokenizer = load_tokenizer(info.tokenizer_source)
        images = make_image_processor(
            _ModelFiles(info.model_config, info.model_source),
            info.model.args, self.tokenizer)
        self.input_processor = InputProcessor(
            self.tokenizer, vocab_size=info.model.vocab_size,
            max_model_len=info.model.max_model_len,
            max_logprobs=info.max_logprobs,
            max_num_seqs=info.model.max_num_seqs, images=images,
            architecture=info.model_config.architecture,
            # Compiled here too: a schema the library refuses is a 400
            # before the request is sent; the core compiles its own copy
            # (matchers do not cross processes).
            grammars=GrammarCompiler(self.tokenizer, info.model.vocab_size,
                                     info.model.eos_token_ids))
        self.accepting = True
        self.dead_error: BaseException | None = None
        self._core_alive = core_alive
        self._codec = Codec()
        self._streams: dict[str, RequestStream] = {}  # event loop only
        self._prompts: dict[str, ProcessedInput] = {}  # their prompts
        self._text = FrontendText(self.tokenizer)  # their text (event loop)
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._core_waiting = 0  # the core's count at its last message
        self._pending = 0  # adds sent, not yet accepted or refused
        self._death_callbacks: list[Callable[[BaseException], None]] = []
        self._lora_watchers: list[Callable[[list[LoRARequest]], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._socket: Any = None
        self._reader: asyncio.Task | None = None

    def describe(self) -> str | None:
        return self.info.describe

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Connects (on the server's event loop)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.asyncio.Context()
        self._socket = self._ctx.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, frontend_identity(self.index))
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(self.address)
        self._reader = self._loop.create_task(self._read())
        if self._core_alive is not None:
            threading.Thread(target=self._watch_core, daemon=True,
                             name="jaxinfer-core-watch").start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self.accepting = False
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        self._fail_streams(ServerShuttingDownError(
            "the server shut down before this request finished"))
        if self._socket is not None:
            self._socket.close()
            self._ctx.term()
            self._socket = None
        self._stop_pool()

    def on_death(self, callback: Callable[[BaseException], None]) -> None:
        self._death_callbacks.append(callback)

    def health(self) -> str | None:
        if self.dead_error is not None:
            return f"the engine core stopped: {self.dead_error}"
        if self._reader is None:
            return "not connected to the engine core"
        return None

    def fail_all(self, error: BaseException) -> None:
        self._soon(self._fail_all, error)

    def _fail_all(self, error: BaseException) -> None:
        ids = list(self._streams)
        if ids:
            self._send(AbortRequests(ids))
        self._fail_streams(error)

    def num_waiting(self) -> int:
        return self._core_waiting + self._pending

    # -- requests -------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: Any,
                          params: SamplingParams | None = None,
                          arrival_time: float | None = None,
                          lora_request: LoRARequest | None = None,
                          priority: int = 0) -> RequestStream:
        self.start()
        self.check_admission()
        if not isinstance(prompt, ProcessedInput):
            prompt = await self.run_blocking(self.input_processor.process,
                                             prompt, params)
        self.check_admission(count_queue=False)  # it may have died meanwhile
        params = prompt.params.clone()
        params.output_kind = RequestOutputKind.DELTA
        assert self._loop is not None
        stream = RequestStream(request_id, self._loop)
        self._streams[request_id] = stream
        self._prompts[request_id] = prompt
        self._pending += 1
        core_params = self._text.add(request_id, prompt, params)
        self._send(AddRequest(
            request_id, prompt.prompt, prompt.prompt_token_ids, core_params,
            time.time() if arrival_time is None else arrival_time, priority,
            lora_request, pack_mm_inputs(prompt.mm_inputs), prompt.pooling))
        try:
            ack = await stream.get()
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        assert ack is ACK, ack
        return stream

    def abort(self, request_id: str) -> None:
        self._soon(self._abort, request_id)

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._prompts.pop(request_id, None)
            self._text.abort(request_id)
            self._send(AbortRequests([request_id]))

    # -- utility calls --------------------------------------------------------

    async def _call(self, method: str, *args) -> Any:
        self.start()
        if self.dead_error is not None:
            raise EngineDeadError(self.health())
        assert self._loop is not None
        call_id = next(self._call_ids)
        future = self._loop.create_future()
        self._calls[call_id] = future
        self._send(UtilityCall(call_id, method, list(args)))
        return await future

    async def add_lora(self, lora_request: LoRARequest) -> LoRARequest:
        fields = {k: v for k, v in dataclasses.asdict(lora_request).items()
                  if v is not None and k != "lora_local_path"}
        return LoRARequest(**await self._call("add_lora", fields))

    def watch_loras(self, callback: Callable[[list[LoRARequest]], None]
                    ) -> None:
        self._lora_watchers.append(callback)

    async def served_loras(self) -> list[LoRARequest]:
        return [LoRARequest(**fields) for fields in await self._call("served_loras")]

    async def remove_lora(self, lora_int_id: int) -> bool:
        return await self._call("remove_lora", lora_int_id)

    async def list_loras(self) -> set[int]:
        return set(await self._call("list_loras"))

    async def render_metrics(self) -> bytes:
        return await self._call("render_metrics")

    async def cache_state(self) -> dict[str, int]:
        """The core's KV pages and request counts (core.cache_state)."""
        return await self._call("cache_state")

    # -- the core's messages ----------------------------------------------------

    def _send(self, msg) -> None:
        if self._socket is None:
            raise ServerShuttingDownError("the server is shutting down")
        self._socket.send(self._codec.encode(msg), copy=False)

    def _soon(self, fn, *args) -> None:
        """Runs ``fn`` on the event loop (from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    async def _read(self) -> None:
        try:
            while True:
                data = await self._socket.recv(copy=False)
                self._handle(self._codec.decode_core(data.buffer))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.exception("reading the engine core's messages failed")
            self._die(EngineDeadError(f"lost the engine core: {e!r}"))

    def _handle(self, msg: CoreOutputs) -> None:
        self._core_waiting = msg.num_waiting
        for rid in msg.accepted:
            self._pending -= 1
            stream = self._streams.get(rid)
            if stream is not None:
                stream.queue.put_nowait(ACK)
        for refused in msg.errors:
            self._pending -= 1
            stream = self._streams.pop(refused.request_id, None)
            self._prompts.pop(refused.request_id, None)
            self._text.abort(refused.request_id)
            if stream is not None:
                stream.queue.put_nowait(rebuild_error(refused.error))
        for out in msg.outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted here meanwhile
            if self._text.owns(out.request_id):
                self._take_text(stream, out)
                continue
            prompt = self._prompts[out.request_id]
            if out.finished:
                del self._streams[out.request_id], self._prompts[out.request_id]
            if out.pooled is not None:
                stream.queue.put_nowait(PoolingRequestOutput(
                    out.request_id,
                    PoolingOutput(np.asarray(out.pooled, np.float32)),
                    prompt.prompt_token_ids, out.finished, out.metrics))
                continue
            stream.queue.put_nowait(RequestOutput(
                request_id=out.request_id, prompt=prompt.prompt,
                prompt_token_ids=prompt.prompt_token_ids, outputs=out.outputs,
                finished=out.finished, prompt_logprobs=out.prompt_logprobs,
                metrics=out.metrics, num_cached_tokens=out.num_cached_tokens))
        for reply in msg.replies:
            future = self._calls.pop(reply.call_id, None)
            if future is None or future.done():
                continue
            if reply.error is not None:
                future.set_exception(rebuild_error(reply.error))
            else:
                future.set_result(reply.result)
        if msg.loras is not None:
            served = [LoRARequest(**fields) for fields in msg.loras]
            for watcher in self._lora_watchers:
                watcher(served)
        if msg.dead is not None:
            self._die(rebuild_error(msg.dead))

    def _take_text(self, stream: RequestStream, out: CoreOutput) -> None:
        """A core output of a request whose text this front end makes."""
        update = self._text.update(out)
        for item in update.outputs:
            stream.queue.put_nowait(item)
        rid = out.request_id
        if update.finished:
            del self._streams[rid], self._prompts[rid]
        if update.stopped_samples:
            self._send(StopSamples(rid, update.stopped_samples))
        if update.stop_request:
            self._send(StopSamples(rid))

    def _watch_core(self) -> None:
        """A thread: blocks until the core process is gone."""
        try:
            self._core_alive.recv()
        except (EOFError, OSError):
            pass
        self._soon(self._die, EngineDeadError(
            "the engine-core process exited"))

    def _die(self, error: BaseException) -> None:
        if self.dead_error is not None:
            return
        self.dead_error = error
        logger.error("the engine core is gone: %s", error)
        self._fail_streams(EngineDeadError(self.health()))
        for callback in self._death_callbacks:
            try:
                callback(error)
            except Exception:
                logger.exception("engine death callback failed")

    def _fail_streams(self, error: BaseException) -> None:
        for stream in self._streams.values():
            stream.queue.put_nowait(error)
        self._streams.clear()
        self._prompts.clear()
        self._text = FrontendText(self.tokenizer)
        self._pending = 0
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
