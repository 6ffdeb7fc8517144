"""A seeded request samples the same tokens alone and inside a batch of 32
other random requests (each request has its own PRNG stream)."""

from __future__ import annotations

import random

import pytest

from jaxinfer import SamplingParams

PROMPT = [1, 310, 311, 312, 313, 9]


def _random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_tokens=10, temperature=rng.choice([0.0, 0.5, 1.0, 1.5]),
        top_k=rng.choice([0, 5, 50]), top_p=rng.choice([1.0, 0.9, 0.5]),
        min_p=rng.choice([0.0, 0.05]), presence_penalty=rng.choice([0.0, 0.8]),
        repetition_penalty=rng.choice([1.0, 1.2]),
        seed=rng.choice([None, rng.randint(0, 1000)]), ignore_eos=True)


@pytest.mark.slow
def test_seeded_request_alone_equals_in_batch(tiny_llm):
    sp = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=1234,
                        ignore_eos=True)
    alone = tiny_llm.generate([{"prompt_token_ids": PROMPT}], sp,
                              use_tqdm=False)[0].outputs[0].token_ids
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [1] + [rng.randrange(3, 40000) for _ in
                                           range(rng.randint(2, 40))]}
               for _ in range(32)]
    params = [_random_params(rng) for _ in prompts]
    prompts.insert(17, {"prompt_token_ids": PROMPT})
    params.insert(17, sp)
    outs = tiny_llm.generate(prompts, params, use_tqdm=False)
    assert outs[17].outputs[0].token_ids == alone
    # (Same max_tokens for all: one batch shape, few compiles.)
    # The others really sampled (not all copies of one stream).
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) > 20
    # A different seed gives a different stream.
    other = tiny_llm.generate([{"prompt_token_ids": PROMPT}],
                              SamplingParams(max_tokens=10, temperature=1.0,
                                             top_p=0.95, seed=4321,
                                             ignore_eos=True),
                              use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone
