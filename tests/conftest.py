"""Shared fixtures. No test touches the network."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests import interpret_compile_memo, no_network

# Sockets to anything but localhost raise from here on (tests/no_network.py).
no_network.install()
# jax's Mosaic GPU interpreter compiles each distinct warpgroup program once,
# not once per thread and grid point (tests/interpret_compile_memo.py).
interpret_compile_memo.install()


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
