"""A real server on a free localhost port, in a background thread of the
test process, in one of two modes:

- ``inproc``: the engine in this process (`AsyncLLMEngine`), so tests can
  also look at its pages directly;
- ``split``: an engine-core process and the front-end app over its
  client, as `jaxinfer serve` runs them (split_server.py).

Modules marked ``both_servers`` run on each (the split one marked slow);
the others on ``inproc``. The environment variable JAXINFER_TEST_SERVER
(``inproc``, ``split`` or ``both``, the default) narrows the first to one
mode, and ``split`` moves the others to the split server too."""

from __future__ import annotations

import functools
import inspect
import os
import socket
import threading
import time
from collections.abc import Callable

import pytest

SERVER_ENV = "JAXINFER_TEST_SERVER"
SERVER_MODES = ("inproc", "split")


def chosen_server_modes() -> list[str]:
    """The modes a ``both_servers`` module runs on."""
    chosen = os.environ.get(SERVER_ENV, "both")
    if chosen == "both":
        return list(SERVER_MODES)
    if chosen not in SERVER_MODES:
        raise pytest.UsageError(f"{SERVER_ENV}={chosen!r}: use one of "
                                f"{', '.join(SERVER_MODES)} or both")
    return [chosen]


def default_server_mode() -> str:
    """The mode of every other server test."""
    return "split" if chosen_server_modes() == ["split"] else "inproc"


def pytest_generate_tests(metafunc):
    if ("server_mode" in metafunc.fixturenames
            and metafunc.definition.get_closest_marker("both_servers")):
        metafunc.parametrize("server_mode", [
            pytest.param(m, marks=[pytest.mark.slow] if m == "split" else [])
            for m in chosen_server_modes()], indirect=True, scope="module")


@pytest.fixture(scope="module")
def server_mode(request) -> str:
    """``inproc`` or ``split``: the mode the module's servers start in."""
    return getattr(request, "param", default_server_mode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving ``app`` until ``stop()``."""

    def __init__(self, app, on_stop: Callable[[], None] | None = None):
        import uvicorn
        self.on_stop = on_stop
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
        if self.on_stop is not None:
            self.on_stop()


_process_cache_dir: list[str] = []


def compilation_cache_dir() -> str:
    """This process's persistent compilation cache (JAX keeps one per
    process: the first engine's), else a new temporary one. Engines of
    test servers default to it, so a split server's core process reads
    the programs that in-process engines of the same worker compiled
    (the embedded model's take most of a server test's time)."""
    import atexit
    import shutil
    import tempfile

    import jax
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current:
        return current
    if not _process_cache_dir:
        _process_cache_dir.append(tempfile.mkdtemp(prefix="jaxinfer-test-xla-"))
        atexit.register(shutil.rmtree, _process_cache_dir[0], True)
    return _process_cache_dir[0]


def start_engine(model: str, name: str | None = None, mode=None,
                 max_num_waiting=None, **engine_kwargs):
    """An engine for test servers: an AsyncLLMEngine in ``inproc`` mode, a
    SplitEngine (its core process started) in ``split`` mode (``mode``
    None: default_server_mode()). ``name``: the served model's name, the
    label of its metrics. The compilation cache: this process's
    (compilation_cache_dir()) unless given."""
    from jaxinfer.config import EngineArgs
    engine_kwargs.setdefault("compilation_cache_dir", compilation_cache_dir())
    args = EngineArgs(model=model, **engine_kwargs)
    if (mode or default_server_mode()) == "split":
        from .split_server import SplitEngine
        return SplitEngine(args, max_num_waiting=max_num_waiting,
                           model_name=name or model)
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.metrics import EngineMetrics
    return AsyncLLMEngine.from_engine_args(
        args, max_num_waiting=max_num_waiting,
        metrics=EngineMetrics(name or model))


def stop_engine(engine) -> None:
    """Stops what start_engine started."""
    from .split_server import SplitEngine
    if isinstance(engine, SplitEngine):
        engine.stop()
    else:
        engine.shutdown()


def frontend_client(engine):
    """(client, owns_engine) for another app over ``engine``: the engine
    itself, which that app must leave running, or a split server's new
    front-end client, which is that app's own."""
    from .split_server import SplitEngine
    if isinstance(engine, SplitEngine):
        return engine.new_client(), True
    return engine, False


def serve_app(engine, build_app, *args, **options) -> ServerThread:
    """``build_app(client, *args, owns_engine=..., **options)`` served over
    a front end of ``engine`` that leaves the engine running (in ``split``
    mode the app is what a front-end process serves: the core read any
    --lora-modules already)."""
    client, owns = frontend_client(engine)
    if owns and "lora_modules_loaded" in inspect.signature(build_app).parameters:
        options.setdefault("lora_modules_loaded", True)
    return ServerThread(build_app(client, *args, owns_engine=owns, **options))


def start_server(model: str, served_model_names=None, mode=None,
                 max_num_waiting=None, **engine_and_app_options):
    """(ServerThread, engine) for a model folder or embedded name; the
    server owns the engine (stopping it stops the engine). Options that
    are build_app's go to the app, the rest to EngineArgs."""
    from jaxinfer.entrypoints.openai.api_server import build_app
    app_names = set(inspect.signature(build_app).parameters)
    app_options = {k: engine_and_app_options.pop(k)
                   for k in list(engine_and_app_options) if k in app_names}
    if app_options.get("lora_modules") and (mode or default_server_mode()) == "split":
        raise NotImplementedError("lora_modules on a split test server: give "
                                  "its core the adapters (static_lora_requests)")
    name = (served_model_names or [model])[0]
    engine = start_engine(model, name, mode, max_num_waiting,
                          **engine_and_app_options)
    server = serve_app(engine, build_app, served_model_names, **app_options)
    server.on_stop = functools.partial(stop_engine, engine)
    return server, engine


def openai_client(server):
    """The openai client of a test server: no retries, so a refused request
    fails the test instead of being sent again."""
    import openai
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused",
                         max_retries=0, timeout=120)


def engine_state(engine) -> dict[str, int]:
    """The engine's pages and request counts (jaxinfer.engine.core
    .cache_state): read here in ``inproc`` mode, asked of the core process
    in ``split`` mode."""
    from .split_server import SplitEngine
    if isinstance(engine, SplitEngine):
        return engine.cache_state()
    from jaxinfer.engine.core import cache_state
    return cache_state(engine.engine)


def pages_all_free(engine, timeout: float = 10.0) -> bool:
    """Waits for the engine to settle, then checks every page is free and
    no request is left (nor its output state)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = engine_state(engine)
        if (state["free_pages"] == state["pages"] - state["replicas"]
                and state["unfinished"] == 0 and state["tracked"] == 0):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def tiny_server(tiny_model_factory, server_mode):
    path = tiny_model_factory()
    server, engine = start_server(path, served_model_names=["tiny"],
                                  mode=server_mode,
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
