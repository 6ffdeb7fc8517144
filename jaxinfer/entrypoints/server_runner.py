"""Runs a server app over an `AsyncLLMEngine` until SIGTERM or engine death,
and says how it ended in the exit status (shared by `jaxinfer serve` and the
simple `/generate` server).

- SIGTERM / SIGINT: stop accepting (the listening socket closes, generation
  routes answer 503), let requests in flight finish for ``grace_period``
  seconds, then fail the rest (each client gets a 503 or an error event), and
  exit 0 (1 if the engine loop had died before: see below). No traceback,
  and the process does not end by the signal.
- The engine loop dies: every client was answered by the engine; the server
  keeps answering (/health: 500 and why) for a moment so probes can read the
  reason, then shuts down as above and exits 1, for a supervisor to restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import threading

from ..errors import ServerShuttingDownError
from .connections import ConnectionLimits, uvicorn_options
from .heap import startup_heap_frozen

logger = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD_S = 20.0
# After the engine died: how long /health reports it before the exit starts.
_DEATH_REPORT_S = 1.0


def run_server(app, engine, *, host: str, port: int,
               grace_period: float = DEFAULT_GRACE_PERIOD_S,
               log_level: str = "info",
               limits: ConnectionLimits | None = None, sockets=None) -> int:
    """Serves until stopped; returns the exit status (1: the engine died).
    ``limits``: timeouts and the connection cap (connections.py; its
    defaults when None). ``sockets``: listening sockets to serve on instead
    of binding ``host:port`` (front-end processes share one)."""
    import uvicorn

    if grace_period < 0:
        raise ValueError(f"--shutdown-grace-period must be >= 0, got {grace_period}")

    class GracefulServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's handlers for SIGINT and SIGTERM, restored at the
            end, but without uvicorn's re-raising of the signal afterwards
            (which ends the process by the signal, status 130 / 143, and
            SIGINT with a traceback): the exit status says how the server
            ended, and a drain is a clean end."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit)
                        for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        async def shutdown(self, sockets=None):
            engine.stop_accepting()
            deadline = asyncio.create_task(_end_of_grace(engine, grace_period))
            try:
                await super().shutdown(sockets)
            finally:
                deadline.cancel()

    # uvicorn's own deadline is a backstop: by then every request was failed.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=math.ceil(grace_period) + 5,
                            **uvicorn_options(limits or ConnectionLimits()))
    server = GracefulServer(config)

    def exit_after_death(error: BaseException) -> None:
        logger.error("the engine loop died (%r); exiting in %.1f s", error,
                     _DEATH_REPORT_S)
        timer = threading.Timer(_DEATH_REPORT_S,
                                lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        timer.start()

    engine.on_death(exit_after_death)
    with startup_heap_frozen():  # heap.py: no long collector pauses
        server.run(sockets=sockets)
    return 1 if engine.dead_error is not None else 0


async def _end_of_grace(engine, grace_period: float) -> None:
    await asyncio.sleep(grace_period)
    logger.warning("shutdown grace period (%.1f s) over: failing the requests "
                   "still in flight", grace_period)
    engine.fail_all(ServerShuttingDownError(
        f"the server shut down: this request did not finish within the "
        f"{grace_period:g} s grace period; retry it"))
