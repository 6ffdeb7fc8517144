"""Shared fixtures. No test touches the network."""

from __future__ import annotations

import ctypes
import gc
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests import interpret_compile_memo, no_network

# Sockets to anything but localhost raise from here on (tests/no_network.py).
no_network.install()
# jax's Mosaic GPU interpreter compiles each distinct warpgroup program once,
# not once per thread and grid point (tests/interpret_compile_memo.py).
interpret_compile_memo.install()


@pytest.fixture(scope="module", autouse=True)
def release_module_memory():
    """After each module: drop what its engines left behind. A test worker
    runs hundreds of modules; without this its memory only grows (jit
    caches hold every program compiled, and freed heap stays mapped), and
    two workers plus a server's engine-core process outgrow a 24 GiB
    machine."""
    yield
    gc.collect()
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
        gc.collect()
    if sys.platform == "linux":  # hand freed heap pages back to the system
        ctypes.CDLL("libc.so.6").malloc_trim(0)


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
