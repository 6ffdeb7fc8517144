"""A speculative engine's decode-only step in which no row drafts runs the
plain programs (one scored row per sequence, the plain sampler), not the
verifying ones over k + 1 rows of padding, and gives the same tokens."""

from __future__ import annotations

from jaxinfer import SamplingParams

from .conftest import NGRAM, repetitive_prompts


def _sampler_calls(llm) -> dict[str, int]:
    programs = llm.llm_engine.runner.programs
    return {"plain": programs.sample_program._cache_size(),
            "verify": programs.verify_program._cache_size()}


def test_a_draftless_decode_step_samples_with_the_plain_sampler(make_llm):
    # max_tokens=2: the one decode step after the prefill may not draft
    # (a draft could only run past max_tokens).
    prompts = [{"prompt_token_ids": p} for p in repetitive_prompts(3, seed=5)]
    sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    spec = make_llm(speculative_config=NGRAM)
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, sp,
                                                         use_tqdm=False)]
    calls = _sampler_calls(spec)
    # The prefill step verifies (rows of a prefill bucket may draft); the
    # draftless decode step samples as a plain engine would.
    assert calls["verify"] >= 1 and calls["plain"] >= 1, calls
    assert spec.llm_engine.get_stats().spec_decode.num_drafts == 0
    plain = make_llm()
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, sp,
                                                           use_tqdm=False)]
    assert got == want


def test_steps_with_drafts_still_verify(make_llm):
    prompts = [{"prompt_token_ids": p} for p in repetitive_prompts(3, seed=6)]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    spec = make_llm(speculative_config=NGRAM)
    spec.generate(prompts, sp, use_tqdm=False)
    stats = spec.llm_engine.get_stats().spec_decode
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert _sampler_calls(spec)["verify"] >= 1
