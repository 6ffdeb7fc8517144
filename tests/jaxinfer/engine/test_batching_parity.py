"""Continuous batching with chunked prefill and preemption
(recompute and swap) gives the same greedy tokens as running each prompt
alone, and as HF transformers."""

from __future__ import annotations

import pytest

from jaxinfer import SamplingParams

from .conftest import hf_greedy, random_prompts

MAX_TOKENS = 8
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(64, seed=1)


@pytest.fixture(scope="module")
def solo(make_llm, prompts):
    """Each prompt alone: no chunking, no sharing, no memory pressure."""
    llm = make_llm(max_num_batched_tokens=128, enable_prefix_caching=False)
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [llm.generate({"prompt_token_ids": p}, sp, use_tqdm=False)[0]
            .outputs[0].token_ids for p in prompts]


def _batched(make_llm, prompts, **kw):
    llm = make_llm(num_gpu_blocks_override=20, **kw)  # 19 pages: 304 tokens
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp,
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.llm_engine.get_stats()


def test_solo_equals_hf(tiny_path, prompts, solo):
    assert solo == hf_greedy(tiny_path, prompts, MAX_TOKENS)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_batched_with_preemption_equals_solo(make_llm, prompts, solo, mode):
    assert max(len(p) for p in prompts) > 32, "some prompt must be chunked"
    tokens, stats = _batched(make_llm, prompts, preemption_mode=mode,
                             swap_space=0.01 if mode == "swap" else None)
    assert stats.num_preemptions > 0, "the pool was big enough: no preemption"
    if mode == "swap":
        assert stats.num_swap_outs > 0
    assert stats.prefix_cache_hits > 0
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0
    for i, (got, want) in enumerate(zip(tokens, solo)):
        assert got == want, f"prompt {i} (len {len(prompts[i])}) differs"
