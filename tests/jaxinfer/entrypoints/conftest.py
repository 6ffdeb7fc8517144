"""A real server on a free localhost port, in a background thread of the
test process (so tests can also look at the engine's pages directly)."""

from __future__ import annotations

import socket
import threading
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving ``app`` until ``stop()``."""

    def __init__(self, app):
        import uvicorn
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                log_level="warning", timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(model: str, served_model_names=None, api_key=None,
                 max_num_waiting=None, chat_template=None, **engine_kwargs):
    """(ServerThread, AsyncLLMEngine) for a model folder or embedded name."""
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.openai.api_server import build_app
    from jaxinfer.metrics import EngineMetrics
    name = (served_model_names or [model])[0]
    engine = AsyncLLMEngine.from_engine_args(
        EngineArgs(model=model, **engine_kwargs), max_num_waiting=max_num_waiting,
        metrics=EngineMetrics(name))
    app = build_app(engine, served_model_names, api_key=api_key,
                    chat_template=chat_template)
    return ServerThread(app), engine


def openai_client(server):
    """The openai client of a test server: no retries, so a refused request
    fails the test instead of being sent again."""
    import openai
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused",
                         max_retries=0, timeout=120)


def pages_all_free(engine, timeout: float = 10.0) -> bool:
    """Waits for the loop thread to settle, then checks every page is free."""
    pool = engine.engine.scheduler.kv.pool
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (pool.num_free == pool.num_blocks - 1
                and not engine.engine.has_unfinished_requests()):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def tiny_server(tiny_model_factory):
    path = tiny_model_factory()
    server, engine = start_server(path, served_model_names=["tiny"],
                                  max_model_len=128, num_gpu_blocks_override=256,
                                  max_num_seqs=8, max_num_batched_tokens=128)
    yield server, engine
    server.stop()


# The tiny server's two halves (modules with servers of their own define
# their own `server`).
@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server[0]


@pytest.fixture(scope="module")
def engine(tiny_server):
    return tiny_server[1]
