"""Fixtures shared by the model tests: one HF reference of the embedded model
per session (loading it dequantizes the GGUF file, ~20 s on CPU)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def embedded_gguf_path():
    from jaxinfer.models.embedded import DEFAULT_MODEL, embedded_model_path
    return embedded_model_path(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def hf_embedded(embedded_gguf_path):
    """HfRunner over the embedded GGUF (float32), with the tokenizer the
    engine uses (the same AutoTokenizer call, cached)."""
    from jaxinfer.models import resolve_model
    from jaxinfer.tokenizer import load_tokenizer
    from tests.runners import HfRunner
    tok = load_tokenizer(resolve_model(embedded_gguf_path).tokenizer)
    return HfRunner(embedded_gguf_path, tokenizer=tok)
