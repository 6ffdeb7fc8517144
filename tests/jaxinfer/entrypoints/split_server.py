"""The multi-process server as the server tests drive it: an engine-core
process started as `jaxinfer serve` starts it (`serve_processes.start_core`)
and front ends served from uvicorn threads of the test process, each the
app a front-end process runs, over an `MPEngineClient` of its own.

The tests' engine handle here is `SplitEngine`: the first front end's
client surface (what handlers use), the core process's liveness, and the
core's pages and request counts through its ``cache_state`` utility call,
never the scheduler object (it lives in the other process)."""

from __future__ import annotations

import asyncio
import multiprocessing

# Front-end slots the core is started with: the tests' main app plus the
# few extra apps a module serves over the same engine (a key, /generate).
FRONTEND_SLOTS = 8


class SplitEngine:
    def __init__(self, engine_args, *, max_num_waiting: int | None,
                 model_name: str):
        from jaxinfer.entrypoints.openai.serve_processes import start_core
        self.max_num_waiting = max_num_waiting
        self.core = start_core(multiprocessing.get_context("spawn"),
                               engine_args, frontends=FRONTEND_SLOTS,
                               max_num_waiting=max_num_waiting,
                               model_name=model_name, lora_requests=[])
        self.clients: list = []  # one per app, in order

    @property
    def client(self):
        """The first app's client (the one `start_server` serves)."""
        if not self.clients:
            raise RuntimeError("no app serves this split test engine yet")
        return self.clients[0]

    def new_client(self):
        """A front end's client of its own (one per app: a client keeps to
        the event loop it started on), as the next ZMQ identity."""
        from jaxinfer.engine.mp_client import MPEngineClient
        if len(self.clients) == FRONTEND_SLOTS:
            raise RuntimeError(f"the test core has {FRONTEND_SLOTS} front-end "
                               "slots; raise FRONTEND_SLOTS")
        client = MPEngineClient(self.core.address, self.core.info,
                                index=len(self.clients),
                                core_alive=self.core.core_alive,
                                max_num_waiting=self.max_num_waiting)
        self.clients.append(client)
        return client

    # -- what the tests read of an engine ---------------------------------

    @property
    def is_running(self) -> bool:
        return self.core.process.is_alive() and self.client.dead_error is None

    @property
    def model(self):
        return self.client.model

    @property
    def tokenizer(self):
        return self.client.tokenizer

    @property
    def input_processor(self):
        return self.client.input_processor

    def health(self) -> str | None:
        return self.client.health()

    def cache_state(self, timeout: float = 30.0) -> dict[str, int]:
        """The core's `cache_state` call, asked through a client of an app
        that still serves, on that app's event loop (a client keeps to its
        loop)."""
        for client in self.clients:
            loop = client._loop
            if loop is not None and loop.is_running():
                return asyncio.run_coroutine_threadsafe(
                    client.cache_state(), loop).result(timeout)
        raise RuntimeError("no app of this split test engine is serving")

    def stop(self) -> None:
        """Stops the core (after the apps: their clients see it go);
        idempotent. A core that did not end cleanly on SIGTERM (it died
        during the tests, or its stop failed) fails the teardown."""
        code = self.core.stop()
        if code != 0:
            why = ("stop() killed it: it outlived SIGTERM" if self.core.killed_by_stop
                   else "a signal from outside" if code is not None and code < 0
                   else "its own exit")
            raise RuntimeError(f"the engine-core process exited with {code} ({why})")

    shutdown = stop  # AsyncLLMEngine's name
