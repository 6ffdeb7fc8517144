"""Speculative decoding fixtures: the tiny Llama with small pages, steps
and context (chunked prefill on every prompt longer than 32 tokens), a
draft model for it that agrees on about half of its drafts, a target and
EAGLE heads for it that agree on part of theirs, and a shared
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


def draft_config(path: str, k: int = 3, method: str = "draft_model") -> dict:
    return {"method": method, "model": path, "num_speculative_tokens": k}


@pytest.fixture(scope="session")
def eagle_target(tmp_path_factory):
    """A tiny Llama whose first layer decides its tokens (an EAGLE head
    copied from that layer drafts well for it)."""
    from tests.tiny_models import make_eagle_target
    return make_eagle_target(str(tmp_path_factory.mktemp("eagle-target")))


# make_eagle's settings per method: noise on EAGLE-1's layer, a draft
# vocabulary of half the target's for EAGLE-3 (d2t maps it); either way
# about half of the drafts are rejected.
EAGLE_HEADS = {"eagle": {"noise": 0.01}, "eagle3": {"draft_vocab": 49152 // 2}}


@pytest.fixture(scope="session")
def eagle_heads(eagle_target, tmp_path_factory):
    """method -> an EAGLE head's folder for `eagle_target`."""
    from tests.tiny_models import make_eagle
    return {m: make_eagle(eagle_target, str(tmp_path_factory.mktemp(m)), m,
                          **kw) for m, kw in EAGLE_HEADS.items()}


@pytest.fixture(scope="session")
def spec_case(draft_path, eagle_target, eagle_heads):
    """method -> (target folder or None for the tiny Llama, its
    speculative_config) for each method the equality tests cover."""
    def case(method: str, k: int = 3):
        if method == "ngram":
            return None, NGRAM
        if method == "draft_model":
            return None, draft_config(draft_path, k)
        return eagle_target, draft_config(eagle_heads[method], k, method)
    return case


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="session")
def make_llm(tiny_path, cache_dir):
    from jaxinfer import LLM

    def make(model: str | None = None, **overrides):
        kw = dict(BASE, compilation_cache_dir=cache_dir)
        kw.update(overrides)
        return LLM(model or tiny_path, **kw)
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
