"""A second batch sharing a long system prompt hits the prefix
cache for >= 90% of the shared tokens; outputs equal caching off."""

from __future__ import annotations

import random

import pytest

from jaxinfer import SamplingParams

pytestmark = pytest.mark.slow

SYSTEM = 170  # shared tokens: 10 full pages of 16 plus 10


def _batches():
    rng = random.Random(5)
    system = [rng.randrange(3, 49152) for _ in range(SYSTEM)]
    q = lambda: [rng.randrange(3, 49152) for _ in range(rng.randrange(3, 25))]
    return system, [system + q() for _ in range(3)], [system + q() for _ in range(8)]


def _run(make_llm, caching: bool):
    llm = make_llm(enable_prefix_caching=caching, max_num_batched_tokens=64,
                   max_model_len=256,
                   num_gpu_blocks_override=64)
    sp = SamplingParams(temperature=0.0, max_tokens=6)
    _, first, second = _batches()
    engine = llm.llm_engine
    out1 = llm.generate([{"prompt_token_ids": p} for p in first], sp,
                        use_tqdm=False)
    before = engine.get_stats()
    out2 = llm.generate([{"prompt_token_ids": p} for p in second], sp,
                        use_tqdm=False)
    after = engine.get_stats()
    tokens = [o.outputs[0].token_ids for o in out1 + out2]
    return tokens, out2, after.prefix_cache_hits - before.prefix_cache_hits


def test_second_batch_hits_the_shared_prefix(make_llm):
    tokens_on, out2, hits = _run(make_llm, True)
    shared = SYSTEM * len(out2)
    assert hits >= 0.9 * shared, f"{hits} of {shared} shared tokens hit"
    for o in out2:
        assert o.num_cached_tokens >= 0.9 * SYSTEM
    tokens_off, out2_off, hits_off = _run(make_llm, False)
    assert hits_off == 0 and all(o.num_cached_tokens == 0 for o in out2_off)
    assert tokens_on == tokens_off
