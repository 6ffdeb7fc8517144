"""Shared fixtures. No test touches the network."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from tests import no_network  # noqa: E402

# Sockets to anything but localhost raise from here on (tests/no_network.py).
no_network.install()


def _test_xla_cache(config) -> str:
    """This run's compilation cache directory. The xdist controller picks
    the run id and hands it to its workers (``--testrunuid``)."""
    import tempfile
    import uuid
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        run = worker["testrunuid"]
    else:
        run = getattr(config.option, "testrunuid", None) or uuid.uuid4().hex
        if hasattr(config.option, "testrunuid"):
            config.option.testrunuid = run
    return os.path.join(tempfile.gettempdir(), f"jaxinfer-test-xla-{run}")


def pytest_configure(config):
    """One persistent compilation cache for the whole run, shared by the
    xdist workers and the processes tests start: compiling is most of the
    suite's time, and many tests build the same small engines, so a step
    program compiled by one worker is read by the other. JAX keeps one
    cache per process, so the tests' own ``compilation_cache_dir`` values
    then only say whether an engine reports one. The directory is new each
    run and removed at its end: no run reads another's programs."""
    cache = config._jaxinfer_xla_cache = _test_xla_cache(config)
    os.environ["JAXINFER_COMPILATION_CACHE_DIR"] = cache
    from jaxinfer.worker.warmup import enable_compilation_cache
    enable_compilation_cache(cache)


def pytest_unconfigure(config):
    if getattr(config, "workerinput", None) is None:  # the controller, or -n 0
        import shutil
        shutil.rmtree(getattr(config, "_jaxinfer_xla_cache", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """make(arch="llama", rope="default", **config_overrides) -> folder,
    cached per argument set for the session."""
    from tests.tiny_models import make_tiny_model
    cache: dict = {}

    def make(arch="llama", rope="default", **overrides):
        key = (arch, rope, tuple(sorted(overrides.items())))
        if key not in cache:
            path = tmp_path_factory.mktemp(f"tiny-{arch}-{rope}")
            cache[key] = make_tiny_model(str(path), arch, rope, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llava_path(tmp_path_factory):
    """A tiny random LLaVA folder (tests/tiny_llava.py), once a session."""
    from tests.tiny_llava import make_tiny_llava
    return make_tiny_llava(str(tmp_path_factory.mktemp("tiny-llava")))
