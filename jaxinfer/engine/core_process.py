"""The engine-core process of a multi-process server: it builds the engine,
tells the server what the front ends need (`CoreInfo`), then runs one loop:

    receive front ends' messages (ZMQ ROUTER; never blocks while busy)
    -> add / abort / utility calls
    -> one engine step
    -> one `CoreOutputs` message per front end with news

The loop also watches one pipe per front end (EOF: that front end died;
its requests are aborted, so their pages are freed and the other front
ends' requests go on) and a wake-up pipe for work finished on worker
threads (LoRA adapters read from disk). An error in a step is a bug that
no request can be blamed for: every front end is told (each answers its
clients) and the process exits 1.
"""

from __future__ import annotations

import concurrent.futures
import faulthandler
import logging
import os
import queue
import signal
import sys
from typing import Any

import zmq

from ..errors import EngineDeadError
from ..metrics import EngineMetrics
from .core import EngineCore
from .core_info import DUMP_STACKS_SIGNAL, CoreInfo, frontend_identity, start_error
from .core_messages import (
    UTILITY_METHODS,
    AbortRequests,
    AddRequest,
    Codec,
    CoreOutputs,
    RequestError,
    StopSamples,
    UtilityCall,
    UtilityReply,
    error_info,
)

logger = logging.getLogger(__name__)

# While idle, how often the loop looks up even when the wake-up pipe is
# quiet (it normally wakes the loop at once): a bound on how long a missed
# wake-up could keep a stop or a worker thread's result waiting.
_IDLE_POLL_MS = 1000


def run_engine_core(args, address: str, ready, frontend_pipes: list,
                    core_alive, max_num_waiting: int | None, model_name: str,
                    lora_requests: list) -> None:
    """The process's body (``ready``: a pipe to the server, which gets
    ``("ready", CoreInfo)`` or ``("error", exception)``; ``core_alive``: a
    pipe end held open while this process lives)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops us last
    from .llm_engine import LLMEngine
    try:
        engine = LLMEngine.from_engine_args(args)
        for request in lora_requests:  # --lora-modules: a bad one stops here
            engine.add_lora(request)
        info = CoreInfo.of(engine)
    except BaseException as e:  # noqa: BLE001 - reported to the server
        ready.send(("error", start_error(e)))
        ready.close()
        sys.exit(2 if isinstance(e, ValueError) else 1)
    core = EngineCore(engine, max_num_waiting=max_num_waiting,
                      metrics=EngineMetrics(model_name,
                                            max_model_len=engine.max_model_len))
    core.register_loras(lora_requests)
    loop = CoreLoop(core, address, frontend_pipes)
    loop.install_signal_handlers()
    ready.send(("ready", info))
    ready.close()
    code = loop.run()
    del core_alive  # held until here: its EOF tells the front ends
    close = getattr(engine, "close", None)
    if close is not None:  # queued background builds would delay the exit
        close()
    shutdown = getattr(engine, "shutdown", None)
    if shutdown is not None:  # worker processes (Ray, data parallel)
        shutdown()
    # A background build already compiling cannot be interrupted, and at
    # exit Python joins its thread: on a busy machine that outlasted the
    # server's SIGTERM grace and the core was killed. Everything this
    # process owns is released by now, so it ends without the join.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class CoreLoop:
    def __init__(self, core: EngineCore, address: str, frontend_pipes: list):
        self.core = core
        self.codec = Codec()
        self.stopping = False
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # never drop an output
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.bind(address)
        self.frontends = {pipe.fileno(): (frontend_identity(i), pipe)
                          for i, pipe in enumerate(frontend_pipes)}
        self.wake_r, self.wake_w = os.pipe()
        # Never blocks a writer (a signal's wake-up byte included): a full
        # pipe already wakes the loop.
        os.set_blocking(self.wake_w, False)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(self.wake_r, zmq.POLLIN)
        for fd in self.frontends:
            self.poller.register(fd, zmq.POLLIN)
        self.pool = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="jaxinfer-core-io")
        self.finished: queue.SimpleQueue = queue.SimpleQueue()  # from workers
        self.jobs = 0  # worker-thread jobs not yet drained
        self.news: dict[bytes, CoreOutputs] = {}
        self.died: BaseException | None = None
        on_failure = getattr(core.engine, "on_failure", None)
        if on_failure is not None:  # a Ray worker died while we were idle
            on_failure(self._engine_failed)

    def install_signal_handlers(self) -> None:
        """SIGTERM stops the loop (`stop`); DUMP_STACKS_SIGNAL writes every
        thread's stack to stderr. The main thread's only."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        # A signal may be delivered to any thread (XLA's, the build and I/O
        # workers'); Python then runs the handler only once the main thread
        # executes bytecode, which a poll that no event ends does not. With
        # the pipe as the wake-up fd, the signal itself wakes the poll.
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        if DUMP_STACKS_SIGNAL is not None:
            faulthandler.register(DUMP_STACKS_SIGNAL, all_threads=True)

    def stop(self) -> None:
        """Ends the loop after its current step (a signal handler)."""
        self.stopping = True
        self._wake()

    def _engine_failed(self, error: BaseException) -> None:
        self.died = error
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"!")
        except BlockingIOError:  # the pipe is full: the loop wakes anyway
            pass

    def run(self) -> int:
        """Serves until SIGTERM (0) or the engine dies (1)."""
        try:
            while not self.stopping:
                busy = self.core.has_unfinished_requests()
                timeout = 0 if busy else _IDLE_POLL_MS
                try:
                    events = dict(self.poller.poll(timeout))
                except zmq.ZMQError:  # interrupted by SIGTERM
                    continue
                if self.socket in events:
                    self._receive()
                for fd in [fd for fd in events if fd in self.frontends]:
                    self._frontend_gone(fd)
                if self.wake_r in events:
                    os.read(self.wake_r, 4096)
                self._drain_jobs()
                if self.died is not None:
                    raise self.died
                if self.core.has_unfinished_requests():
                    for frontend, outputs in self.core.step().items():
                        self._news(frontend).outputs.extend(outputs)
                self.core.record_stats()
                self._send_news()
        except BaseException as e:
            logger.exception("the engine core stopped")
            dead = error_info(EngineDeadError(
                f"the engine core stopped: {e!r}"))
            for identity, _ in self.frontends.values():
                self._send(identity, CoreOutputs(dead=dead))
            return 1
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.socket.close()
            self.ctx.term()
        self.core.fail_all()
        return 0

    # -- messages ---------------------------------------------------------

    def _news(self, frontend: bytes) -> CoreOutputs:
        news = self.news.get(frontend)
        if news is None:
            news = self.news[frontend] = CoreOutputs()
        return news

    def _receive(self) -> None:
        while True:
            try:
                frontend, data = self.socket.recv_multipart(zmq.NOBLOCK,
                                                            copy=True)
            except zmq.Again:
                return
            msg = self.codec.decode_frontend(data)
            if isinstance(msg, AddRequest):
                if (msg.lora_request is not None  # read on a worker thread
                        or msg.params.structured_outputs is not None):
                    self._submit(frontend, msg, self._prepare)
                else:
                    self._added(frontend, msg, self.core.add(frontend, msg))
            elif isinstance(msg, AbortRequests):
                self.core.abort(msg.request_ids)
            elif isinstance(msg, StopSamples):
                self.core.stop(msg)
            elif isinstance(msg, UtilityCall):
                if msg.method == "add_lora":  # reads files: a worker thread
                    self._submit(frontend, msg, self._utility)
                else:
                    reply = self._utility(msg)
                    self._news(frontend).replies.append(reply)
                    if msg.method == "remove_lora" and reply.error is None:
                        self._tell_loras()

    def _added(self, frontend: bytes, msg: AddRequest,
               error: RequestError | None) -> None:
        news = self._news(frontend)
        if error is None:
            news.accepted.append(msg.request_id)
        else:
            news.errors.append(error)

    def _tell_loras(self) -> None:
        """Every front end learns the served adapters (one changed)."""
        loras = self.core.loras()
        for identity, _ in self.frontends.values():
            self._news(identity).loras = loras

    def _utility(self, msg: UtilityCall) -> UtilityReply:
        try:
            if msg.method not in UTILITY_METHODS:
                raise ValueError(f"unknown engine-core call {msg.method!r}")
            return UtilityReply(msg.call_id, self.core.call(msg.method, msg.args))
        except Exception as e:  # noqa: BLE001 - answered to the caller
            return UtilityReply(msg.call_id, error=error_info(e))

    def _prepare(self, msg: AddRequest) -> Any:
        """Reads the request's adapter and compiles its grammar (a worker
        thread: neither holds up the step loop)."""
        try:
            self.core.compile_grammar(msg)
            return ("adapter", self.core.load_adapter(msg))
        except Exception as e:  # noqa: BLE001 - fails this request alone
            return ("error", e)

    def _submit(self, frontend: bytes, msg, work) -> None:
        def job():
            result = work(msg)
            self.finished.put((frontend, msg, result))
            self._wake()
        self.jobs += 1
        self.pool.submit(job)

    def _drain_jobs(self) -> None:
        while True:
            try:
                frontend, msg, result = self.finished.get_nowait()
            except queue.Empty:
                return
            self.jobs -= 1
            if isinstance(msg, UtilityCall):
                self._news(frontend).replies.append(result)
                if result.error is None:
                    self._tell_loras()
                continue
            kind, value = result
            if kind == "error":
                from ..errors import InvalidRequestError
                error = value if isinstance(value, ValueError) else \
                    InvalidRequestError(str(value))
                self._added(frontend, msg, RequestError(msg.request_id,
                                                        error_info(error)))
            else:
                self._added(frontend, msg, self.core.add(frontend, msg, value))

    def _frontend_gone(self, fd: int) -> None:
        identity, pipe = self.frontends.pop(fd)
        self.poller.unregister(fd)
        pipe.close()
        self.news.pop(identity, None)
        n = self.core.abort_frontend(identity)
        logger.warning("front end %s exited: its %d request(s) aborted",
                       identity.decode(), n)

    def _send_news(self) -> None:
        if not self.news:
            return
        waiting = self.core.num_waiting()
        news, self.news = self.news, {}
        for frontend, msg in news.items():
            msg.num_waiting = waiting
            self._send(frontend, msg)

    def _send(self, frontend: bytes, msg: CoreOutputs) -> None:
        try:
            self.socket.send_multipart([frontend, self.codec.encode(msg)],
                                       copy=False)
        except zmq.ZMQError as e:  # that front end is gone
            logger.debug("could not reach front end %s: %s", frontend, e)

