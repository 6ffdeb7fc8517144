"""`jaxinfer serve` as separate processes, as vLLM V1 serves:

    this process (no JAX): binds the port, starts the rest, supervises
      |- engine core (core_process.py): the engine, its scheduler and device
      |     loop; ZMQ ROUTER at an ipc:// address
      |- front end 0 .. N-1 (--api-server-count): uvicorn + FastAPI on the
            shared listening socket; tokenize, check, stream SSE; a ZMQ
            DEALER each; never import JAX

Pipes tell each side of the other's death: the core holds the write end
of one every front end reads (EOF: fail every stream, /health 500, exit 1)
and each front end holds the write end of one the core reads (EOF: abort
that front end's requests; the others go on).

SIGTERM / SIGINT here: every front end gets SIGTERM (its grace period:
requests finish, the rest get 503), then the core is stopped. The exit
status is 1 if the core died, else the front ends' worst.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from typing import Any

from ...engine.core_info import DUMP_STACKS_SIGNAL, CoreInfo

logger = logging.getLogger(__name__)

# After the core died: how long the front ends get to answer and exit.
_FRONTEND_EXIT_S = 15.0


def default_api_server_count() -> int:
    """One front end per four CPU cores, from one to four: tokenizing and
    streaming need a core each, the engine core needs its own."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def serve_processes(engine_args, *, api_server_count: int, host: str, port: int,
                    served_model_names: list[str] | None,
                    max_num_waiting: int | None, grace_period: float,
                    log_level: str, lora_modules=None, **frontend_options) -> int:
    """Starts the engine core and the front ends; serves until SIGTERM or
    the core's death; returns the exit status."""
    if api_server_count < 1:
        raise ValueError(f"--api-server-count must be >= 1, got {api_server_count}")
    names = list(served_model_names or [engine_args.model])
    ctx = multiprocessing.get_context("spawn")
    listener = _listen(host, port)
    core = start_core(ctx, engine_args, frontends=api_server_count,
                      max_num_waiting=max_num_waiting, model_name=names[0],
                      lora_requests=static_lora_requests(lora_modules or []))
    frontends: list = []
    try:
        info = core.info
        if info.describe:
            print(info.describe, flush=True)
        if info.warmup_programs:
            print(f"warm-up: {info.warmup_programs} programs compiled in "
                  f"{info.warmup_seconds:.1f} s", flush=True)
        options = dict(frontend_options, served_model_names=names,
                       max_num_waiting=max_num_waiting,
                       grace_period=grace_period, log_level=log_level,
                       lora_modules=lora_modules)
        for i, alive_w in enumerate(core.frontend_alive):
            p = ctx.Process(target=_frontend_main, name=f"jaxinfer-api-{i}",
                            args=(i, listener, core.address, info,
                                  core.core_alive, alive_w, options))
            p.start()
            alive_w.close()
            frontends.append(p)
        core.core_alive.close()
        listener.close()  # the front ends hold it now
        print(f"serving on http://{host}:{port}: {api_server_count} API "
              f"server process(es), engine core pid {core.process.pid}",
              flush=True)
        return _supervise(core.process, frontends, grace_period)
    finally:
        for p in frontends + [core.process]:
            if p.is_alive():
                p.kill()
            p.join(5)
        core.remove_files()


@dataclasses.dataclass
class CoreProcess:
    """A started engine-core process and what its front ends reach it by."""
    process: Any  # multiprocessing's Process
    address: str  # its ZMQ ROUTER
    info: CoreInfo  # what it told at start
    core_alive: Any  # a pipe's read end: EOF once the core is gone
    # Write ends, one per front end: the core aborts front end i's
    # requests once [i] is closed (in every process holding it).
    frontend_alive: list
    workdir: str | None  # the ipc socket's folder (None: an abstract socket)
    # Whether stop() had to SIGKILL it (it outlived SIGTERM by the
    # timeout): tells that -9 apart from a kill from outside (the OOM killer).
    killed_by_stop: bool = False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (its requests are failed, its front ends told), SIGKILL
        after ``timeout``; the exit code."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("the engine core did not end within %.0f s of "
                           "SIGTERM; killing it (its threads' stacks are in "
                           "its stderr)", timeout)
            if DUMP_STACKS_SIGNAL is not None:
                os.kill(self.process.pid, DUMP_STACKS_SIGNAL)
                time.sleep(1.0)  # faulthandler writes from the signal
            self.killed_by_stop = True
            self.process.kill()
            self.process.join(5)
        self.remove_files()
        return self.process.exitcode

    def remove_files(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_core(ctx, engine_args, *, frontends: int, max_num_waiting: int | None,
               model_name: str, lora_requests: list) -> CoreProcess:
    """Starts the engine-core process for ``frontends`` front ends (ZMQ
    identities 0 .. frontends-1) and waits until its engine is up; raises
    its start error."""
    if sys.platform == "linux":  # an abstract socket: nothing on disk
        workdir = None
        address = f"ipc://@jaxinfer-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    else:
        workdir = tempfile.mkdtemp(prefix="jaxinfer-serve-")
        address = f"ipc://{workdir}/core"
    ready_r, ready_w = ctx.Pipe(duplex=False)
    core_alive_r, core_alive_w = ctx.Pipe(duplex=False)
    frontend_alive = [ctx.Pipe(duplex=False) for _ in range(frontends)]
    process = ctx.Process(target=_core_main, name="jaxinfer-engine-core", args=(
        engine_args, address, ready_w, [r for r, _ in frontend_alive],
        core_alive_w, max_num_waiting, model_name, lora_requests))
    try:
        process.start()
        for end in [ready_w, core_alive_w] + [r for r, _ in frontend_alive]:
            end.close()
        info = _wait_ready(process, ready_r)
    except BaseException:
        if process.pid is not None:
            if process.is_alive():
                process.kill()
            process.join(5)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return CoreProcess(process, address, info, core_alive_r,
                       [w for _, w in frontend_alive], workdir)


def static_lora_requests(modules) -> list:
    """``--lora-modules`` as the LoRARequests the core loads at start: ids
    1, 2, ... in order, the ids each front end's ServingModels gives them."""
    from ...lora.request import LoRARequest
    return [LoRARequest(m.name, i + 1, m.path, base_model_name=m.base_model_name)
            for i, m in enumerate(modules)]


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _wait_ready(core, ready_r):
    """The core's CoreInfo once its engine is up; its start error raised."""
    while not ready_r.poll(0.5):
        if not core.is_alive():
            raise RuntimeError(f"the engine-core process exited with code "
                               f"{core.exitcode} while starting (see its log)")
    try:
        kind, payload = ready_r.recv()
    except EOFError:
        core.join(10)
        raise RuntimeError(f"the engine-core process exited with code "
                           f"{core.exitcode} while starting (see its log)") from None
    finally:
        ready_r.close()
    if kind == "error":
        core.join(10)
        raise payload
    return payload


def _supervise(core, frontends: list, grace_period: float) -> int:
    stopping: list[int] = []

    def stop(signum, _frame):
        if not stopping:
            stopping.append(signum)
            for p in frontends:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        live = list(frontends)
        while live and core.is_alive():
            multiprocessing.connection.wait(
                [core.sentinel] + [p.sentinel for p in live])
            for p in [p for p in live if not p.is_alive()]:
                live.remove(p)
                if not stopping:
                    logger.error("API server %s exited with code %s; %d "
                                 "other(s) keep serving", p.name, p.exitcode,
                                 len(live))
        core_died = not core.is_alive()
        if core_died:  # the front ends answer their clients, then exit 1
            deadline = time.time() + _FRONTEND_EXIT_S + grace_period
            for p in live:
                p.join(max(0.0, deadline - time.time()))
        else:
            core.terminate()
            core.join(30)
        codes = [p.exitcode for p in frontends if p.exitcode is not None]
        logger.info("exit codes: engine core %s, API servers %s",
                    core.exitcode, codes)
        if core_died or core.exitcode not in (0, None, -signal.SIGTERM):
            return 1
        # uvicorn re-raises the signal it stopped on once it has shut down.
        clean = (0, -signal.SIGTERM) if stopping else (0,)
        return 1 if any(c not in clean for c in codes) else 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _die_with_parent() -> None:
    """Linux: this process is killed when the server process dies, however
    it dies (a supervisor's SIGKILL included), so no engine outlives it."""
    parent = os.getppid()
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipes still tell
        return
    if os.getppid() != parent:  # it died before the call
        os._exit(1)


def _core_main(*args) -> None:
    """The engine-core process (imported there: JAX stays out of here)."""
    _die_with_parent()
    from ...engine.core_process import run_engine_core
    run_engine_core(*args)


def _frontend_main(index: int, listener, address: str, info, core_alive,
                   alive, options: dict) -> None:
    """An API-server process: the app over an `MPEngineClient`."""
    _die_with_parent()
    from ...engine.mp_client import MPEngineClient
    from ..server_runner import run_server
    from .api_server import build_app
    logging.basicConfig(level=logging.INFO)
    grace_period = options.pop("grace_period")
    log_level = options.pop("log_level")
    limits = options.pop("limits", None)
    client = MPEngineClient(address, info, index=index, core_alive=core_alive,
                            max_num_waiting=options.pop("max_num_waiting"))
    names = options.pop("served_model_names")
    app = build_app(client, names, lora_modules_loaded=True, **options)
    code = run_server(app, client, host="", port=0, grace_period=grace_period,
                      log_level=log_level, limits=limits, sockets=[listener])
    del alive  # held open until here: its EOF tells the core
    sys.exit(code)
