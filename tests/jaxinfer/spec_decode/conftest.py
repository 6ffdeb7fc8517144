"""Speculative decoding fixtures: the tiny Llama with small pages, steps
and context (chunked prefill on every prompt longer than 32 tokens), a
draft model for it that agrees on about half of its drafts, and a shared
compilation cache."""

from __future__ import annotations

import random

import pytest

BASE = dict(dtype="float32", max_model_len=128, max_num_seqs=8,
            max_num_batched_tokens=32, block_size=16)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3,
         "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="session")
def tiny_path(tiny_model_factory):
    return tiny_model_factory()


@pytest.fixture(scope="session")
def draft_path(tiny_path, tmp_path_factory):
    """The tiny Llama's weights plus a little noise: about half of its
    greedy drafts are accepted, so both verification branches run."""
    from tests.tiny_models import make_draft
    return make_draft(tiny_path, str(tmp_path_factory.mktemp("tiny-draft")),
                      noise=0.004)


def draft_config(path: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": k}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="session")
def make_llm(tiny_path, cache_dir):
    from jaxinfer import LLM

    def make(**overrides):
        kw = dict(BASE, compilation_cache_dir=cache_dir)
        kw.update(overrides)
        return LLM(tiny_path, **kw)
    return make


def repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts that repeat a random run (so n-gram lookup drafts),
    of mixed lengths; every fourth starts with the same 40 tokens (prefix
    cache hits)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 49152) for _ in range(40)]
    out = []
    for i in range(n):
        run = [rng.randrange(3, 49152) for _ in range(rng.randrange(2, 9))]
        body = run * rng.randrange(2, 5) + run[:rng.randrange(len(run))]
        out.append((shared if i % 4 == 0 else []) + body)
    return out
