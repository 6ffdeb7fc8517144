"""With speculation (n-gram lookup, a draft model or an EAGLE head) an
engine produces
the tokens it produces without: greedy rows token for token, seeded rows too (each position draws
with the key a plain step uses there), stop strings, max_tokens and
logprobs alike, under chunked prefill, prefix-cache hits, preemption and
an abort; rejected drafts give their pages back after every step."""

from __future__ import annotations

import random

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.core.kv_cache_manager import cdiv

from .conftest import NGRAM, repetitive_prompts

pytestmark = pytest.mark.slow


def _params(rng: random.Random) -> SamplingParams:
    kind = rng.choice(["greedy", "seeded", "stop", "logprobs", "penalty"])
    n = rng.randrange(1, 24)
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=n)
    if kind == "seeded":
        return SamplingParams(temperature=1.0, top_p=rng.choice([1.0, 0.9]),
                              seed=rng.randrange(1000), max_tokens=n,
                              ignore_eos=True)
    if kind == "stop":  # the tiny model's text hits single letters
        return SamplingParams(temperature=0.0, max_tokens=24,
                              stop=[rng.choice("aeiou"), rng.choice("nrst")])
    if kind == "logprobs":
        return SamplingParams(temperature=0.0, max_tokens=n, logprobs=2)
    # Penalties count every sampled token on the host: decoded one a step.
    return SamplingParams(temperature=0.0, max_tokens=n,
                          repetition_penalty=1.3)


def _tables_fit(engine) -> bool:
    """Each running request holds exactly the pages of its computed
    tokens: none left over from rejected drafts."""
    kv, B = engine.scheduler.kv, engine.cache_config.block_size
    return all(len(kv.block_table(r.request_id)) == cdiv(r.num_computed_tokens, B)
               for r in engine.scheduler.running)


def _run(engine, prompts, params, abort_id=None, abort_after=3):
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), {"prompt_token_ids": p}, sp)
    final, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0]
        assert _tables_fit(engine)
        steps += 1
        if steps == abort_after and abort_id is not None:
            engine.abort_request(abort_id)
    return final, steps


def _same(a, b) -> None:
    assert a.keys() == b.keys()
    for rid in a:
        x, y = a[rid], b[rid]
        assert (x.token_ids, x.text, x.finish_reason) == (
            y.token_ids, y.text, y.finish_reason), rid
        assert (x.logprobs is None) == (y.logprobs is None)
        for lx, ly in zip(x.logprobs or [], y.logprobs or []):
            assert lx.keys() == ly.keys()
            for t in lx:
                assert lx[t].logprob == pytest.approx(ly[t].logprob, abs=1e-4)


# Plain decoding's outputs per (target, pool size, swap space): the methods
# of one target compare against the same run. The tests share a worker
# (their xdist group) so that each plain run happens once.
_PLAIN_RESULTS: dict = {}


@pytest.mark.xdist_group("spec_outputs_equal")
@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle", "eagle3"])
@pytest.mark.parametrize("blocks,swap", [(None, None), (14, None), (14, 0.01)],
                         ids=["roomy", "recomputing", "swapping"])
def test_outputs_equal_with_and_without_speculation(make_llm, spec_case,
                                                    method, blocks, swap):
    prompts = repetitive_prompts(16, seed=2)
    results = {}
    target, config = spec_case(method)
    if blocks is not None and target is not None:
        # The EAGLE target's outputs are shorter: a smaller pool preempts.
        blocks = 10
    for spec in (None, config):
        plain_key = (target, blocks, swap)
        if spec is None and plain_key in _PLAIN_RESULTS:
            results[False] = _PLAIN_RESULTS[plain_key]
            continue
        engine = make_llm(target, speculative_config=spec, swap_space=swap,
                          num_gpu_blocks_override=blocks).llm_engine
        rng = random.Random(5)
        params = [_params(rng) for _ in prompts]
        results[spec is not None], steps = _run(engine, prompts, params,
                                                abort_id="3")
        pool = engine.scheduler.kv.pool
        assert pool.num_free == pool.num_blocks - 1
        if spec is None:
            _PLAIN_RESULTS[plain_key] = results[False]
        else:
            stats = engine.get_stats()
            assert stats.spec_decode.num_accepted_tokens > 0
            # Drafts were rejected too (a draft model's or an EAGLE head's
            # part of the time).
            assert (stats.spec_decode.num_accepted_tokens
                    < stats.spec_decode.num_draft_tokens)
            assert stats.num_preemptions > 0 or blocks is None
            assert stats.num_swap_outs > 0 or swap is None
            assert stats.prefix_cache_hits > 0
    _same(results[True], results[False])
    assert "3" not in results[True]
    reasons = {o.finish_reason for o in results[True].values()}
    assert {"stop", "length"} <= reasons


# The plain engines of the next tests are the roomy cases' (BASE): on the
# same worker their programs come from the compilation cache.
@pytest.mark.xdist_group("spec_outputs_equal")
def test_verifying_steps_through_the_pallas_kernels(make_llm):
    """Verifying steps take the attention kernels' short-query path (each
    row's k + 1 tokens as decode rows, interpret mode on CPU): greedy
    tokens equal plain decoding's through the jnp reference."""
    import jax
    backend = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"
    prompts = [{"prompt_token_ids": p} for p in repetitive_prompts(4, seed=3)]
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    plain = make_llm().generate(prompts, sp, use_tqdm=False)
    llm = make_llm(speculative_config=NGRAM, attention_backend=backend)
    spec = llm.generate(prompts, sp, use_tqdm=False)
    assert ([o.outputs[0].token_ids for o in spec]
            == [o.outputs[0].token_ids for o in plain])
    engine = llm.llm_engine
    assert engine.get_stats().spec_decode.num_accepted_tokens > 0
    assert any(p.bucket.max_q_len == NGRAM["num_speculative_tokens"] + 1
               for p in engine.runner.programs.models_run)


# The embedded SmolLM2, with each method where it drafts well: n-gram
# lookup on text that repeats itself, and the model (GGUF) as its own draft
# (its greedy drafts are the target's greedy tokens, so nearly all are
# accepted). Either way the tokens stay those of plain decoding.
EMBEDDED_CASES = {
    "ngram": ({"method": "ngram", "num_speculative_tokens": 4,
               "prompt_lookup_max": 4, "prompt_lookup_min": 2},
              ["def add(a, b):\n    return a + b\n\n"
               "def sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
               "one two three four five one two three four five one two"],
              0.3, 1.5),
    "draft_model": ({"method": "draft_model", "num_speculative_tokens": 3,
                     "model": "smollm2-135m-instruct"},
                    ["The capital of France is", "def fib(n):\n"], 0.9, 3.0),
}


EMBEDDED_ENGINE = dict(max_num_seqs=2, max_model_len=256)


@pytest.fixture(scope="module")
def embedded_plain():
    """The embedded model without speculation: one engine (and its
    compiles) for every method's plain run."""
    return LLM(**EMBEDDED_ENGINE)


# One worker runs both methods, so the plain engine is built once.
@pytest.mark.xdist_group("spec_embedded")
@pytest.mark.parametrize("method", list(EMBEDDED_CASES))
def test_greedy_equal_on_the_embedded_model(embedded_plain, method):
    spec, prompts, min_rate, min_length = EMBEDDED_CASES[method]
    sp = SamplingParams(temperature=0.0, max_tokens=32)
    outs = {}
    llm = LLM(speculative_config=spec, **EMBEDDED_ENGINE)
    for spec_on, engine in ((False, embedded_plain), (True, llm)):
        outs[spec_on] = [o.outputs[0].token_ids for o in
                         engine.generate(prompts, sp, use_tqdm=False)]
    assert outs[False] == outs[True]
    stats = llm.llm_engine.get_stats().spec_decode
    assert stats.acceptance_rate > min_rate
    assert stats.mean_accepted_length > min_length


@pytest.mark.xdist_group("spec_outputs_equal")
def test_n_samples_and_prompt_logprobs_equal_without_speculation(make_llm):
    prompts = [{"prompt_token_ids": p} for p in repetitive_prompts(3, seed=9)]
    sp = SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=12,
                        ignore_eos=True, prompt_logprobs=1)
    got = {}
    for spec in (None, NGRAM):
        outs = make_llm(speculative_config=spec).generate(prompts, sp,
                                                          use_tqdm=False)
        got[spec is None] = outs
    for a, b in zip(got[False], got[True]):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs)
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            assert x.keys() == y.keys()
