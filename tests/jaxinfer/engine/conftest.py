"""Engine fixtures: one tiny Llama and a shared persistent compilation cache
(engines in one test process then compile each step shape once)."""

from __future__ import annotations

import random

import pytest

# Small everything: 16-token pages, 128-token context, 32-token steps.
BASE = dict(dtype="float32", max_model_len=128, max_num_seqs=8,
            max_num_batched_tokens=32, block_size=16)


@pytest.fixture(scope="session")
def tiny_path(tiny_model_factory):
    return tiny_model_factory()


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


def random_prompts(n: int, seed: int = 0, shared_prefix: int = 60,
                   every: int = 4, max_len: int = 60) -> list[list[int]]:
    """Token-id prompts of mixed lengths; every ``every``-th starts with the
    same ``shared_prefix`` tokens."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 49152) for _ in range(shared_prefix)]
    return [(prefix if i % every == 0 else []) +
            [rng.randrange(3, 49152) for _ in range(rng.randrange(1, max_len))]
            for i in range(n)]


def hf_greedy(path: str, prompts, max_tokens: int) -> list[list[int]]:
    """HF transformers greedy continuations, one prompt at a time (float32),
    cut after the first EOS."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 local_files_only=True).eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 do_sample=False, max_new_tokens=max_tokens,
                                 pad_token_id=next(iter(eos)))
        new = seq[0, len(p):].tolist()
        for i, t in enumerate(new):
            if t in eos:
                new = new[:i + 1]
                break
        outs.append(new)
    return outs
