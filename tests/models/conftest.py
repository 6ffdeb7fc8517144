"""Fixtures shared by the model tests: one HF reference of the embedded model
per session (loading it dequantizes the GGUF file, ~15 s on CPU)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def embedded_gguf_path():
    from jaxinfer.models.embedded import DEFAULT_MODEL, embedded_model_path
    return embedded_model_path(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def hf_embedded(embedded_gguf_path):
    """HfRunner over the embedded GGUF (float32), with HF's own tokenizer
    from the same file (so the engine's tokenizer is checked too)."""
    from tests.runners import HfRunner
    return HfRunner(embedded_gguf_path)
