"""output_kind: cumulative / delta / final-only outputs (text, tokens and
logprobs), and prompt logprobs for a prompt already in the prefix cache."""

from __future__ import annotations

from jaxinfer import RequestOutputKind, SamplingParams

PROMPT = [1] + list(range(900, 940))  # 41 tokens: 2 full pages + 9


def _run(engine, rid, sp, prompt=PROMPT):
    engine.add_request(rid, {"prompt_token_ids": prompt}, sp)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


def test_cumulative_delta_final_only(tiny_llm):
    engine = tiny_llm.llm_engine
    base = dict(max_tokens=5, temperature=0.0, logprobs=1, ignore_eos=True)
    cum = _run(engine, "c", SamplingParams(**base))
    delta = _run(engine, "d", SamplingParams(
        **base, output_kind=RequestOutputKind.DELTA))
    final = _run(engine, "f", SamplingParams(
        **base, output_kind=RequestOutputKind.FINAL_ONLY))
    assert len(cum) == len(delta) == 5 and len(final) == 1
    assert [len(o.outputs[0].token_ids) for o in cum] == [1, 2, 3, 4, 5]
    assert all(len(o.outputs[0].token_ids) == 1 for o in delta)
    assert all(len(o.outputs[0].logprobs) == 1 for o in delta)
    full = final[0].outputs[0]
    assert full.token_ids == cum[-1].outputs[0].token_ids
    assert sum((o.outputs[0].token_ids for o in delta), []) == full.token_ids
    assert "".join(o.outputs[0].text for o in delta) == full.text
    assert [d.outputs[0].logprobs[0] for d in delta] == full.logprobs
    # The running sum is carried in every kind.
    assert abs(delta[-1].outputs[0].cumulative_logprob
               - full.cumulative_logprob) < 1e-6
    assert [o.finished for o in delta] == [False] * 4 + [True]


def test_prompt_logprobs_complete_despite_prefix_cache(tiny_llm):
    engine = tiny_llm.llm_engine
    assert engine.cache_config.enable_prefix_caching
    _run(engine, "warm", SamplingParams(max_tokens=1))  # caches the prompt
    out = _run(engine, "plp", SamplingParams(max_tokens=1, prompt_logprobs=2))
    plp = out[-1].prompt_logprobs
    assert len(plp) == len(PROMPT) and plp[0] is None
    assert all(PROMPT[i] in plp[i] for i in range(1, len(PROMPT)))
    # A request without prompt logprobs does hit the cache.
    hit = _run(engine, "hit", SamplingParams(max_tokens=1))
    assert hit[-1].num_cached_tokens >= 32
    assert out[-1].num_cached_tokens == 0
