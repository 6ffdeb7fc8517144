"""Sampled outputs keep the target distribution under speculation.

Many seeded draws of the first two output tokens (top_k=4, so the pair
has 16 outcomes) from an engine whose second token is always verified
against a draft are compared with the exact joint distribution computed
from HF transformers' logits: a chi-square goodness-of-fit test at
significance level ALPHA must not reject. The draft is the most likely
second token, so it is accepted often but not always, and both the
accepting and the correcting branch are exercised; the same holds with
drafts decoded on the device by a draft model or an EAGLE head (EAGLE-1,
EAGLE-3) for its target. The same test with an
acceptance rule that accepts every draft (injected into the engine's
programs) must reject."""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest

from jaxinfer import SamplingParams

from .conftest import draft_config

pytestmark = pytest.mark.slow

ALPHA = 1e-3  # chance of a false alarm of the correct rule
TOP_K = 4
# Draws per test, sized by power. Both test models' 16 pairs have
# probabilities 0.053-0.075 (nearly uniform; min * 400 = 21 >= 5). The
# representative wrong rule, a rejected draft d resampled from the target's
# p instead of the residual (p - q)+ (d then drawn with p_d + (1 - p_d) p_d,
# about 0.48 for p_d ~ 0.28), moves the pairs by a chi-square effect
# sum((p' - p)^2 / p) = 0.197 (tiny Llama) and 0.193 (EAGLE target) per
# draw: at N = 400 the noncentrality is 77-79 against the 37.7 critical
# value of df 15 at ALPHA, power 0.9998. Accepting every draft moves them
# by 2.72 per draw (noncentrality 1,088). A correct rule is rejected with
# probability ALPHA whatever N.
NUM_DRAWS = 400
PROMPT = [101, 2202, 303, 4404, 505, 6606, 707, 8808]


def _top_k_probs(model, ids: list[int]) -> dict[int, float]:
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    top = torch.topk(logits, TOP_K)
    probs = torch.softmax(top.values, dim=0)
    return dict(zip(top.indices.tolist(), probs.tolist()))


@functools.cache
def _exact(path: str) -> tuple[dict, dict]:
    """(joint {(t0, t1): p}, the most likely t1 for each t0) of the model
    at ``path``."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, local_files_only=True).eval()
    joint, best = {}, {}
    for t0, p0 in _top_k_probs(model, PROMPT).items():
        second = _top_k_probs(model, PROMPT + [t0])
        best[t0] = max(second, key=second.get)
        for t1, p1 in second.items():
            joint[(t0, t1)] = p0 * p1
    return joint, best


@pytest.fixture(scope="module")
def exact(tiny_path):
    return _exact(tiny_path)


def _seeded_pairs(engine) -> collections.Counter:
    """The (t0, t1) counts of NUM_DRAWS seeded requests of three tokens
    (room for one draft, at the second token only)."""
    for seed in range(NUM_DRAWS):
        engine.add_request(str(seed), {"prompt_token_ids": PROMPT},
                           SamplingParams(temperature=1.0, top_k=TOP_K,
                                          seed=seed, max_tokens=3,
                                          ignore_eos=True))
    pairs: collections.Counter = collections.Counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                pairs[tuple(out.outputs[0].token_ids[:2])] += 1
    return pairs


def _draw_pairs(engine, best: dict[int, int]
                ) -> tuple[collections.Counter, int]:
    """NUM_DRAWS seeded requests; each one's second token is verified
    against the draft best[t0]. Returns the (t0, t1) counts and how many
    drafts were accepted."""
    spec = engine.scheduler.speculation

    def propose(running):
        return {r.request_id: [best.get(r.output_token_ids[0], 0)]
                for r in running
                if spec.eligible(r) and len(r.output_token_ids) == 1}
    spec.propose = propose
    pairs = _seeded_pairs(engine)
    stats = engine.get_stats().spec_decode
    assert stats.num_drafts == NUM_DRAWS  # every second token was verified
    return pairs, stats.num_accepted_tokens


def _p_value(pairs: collections.Counter, joint: dict) -> float:
    """Chi-square goodness of fit of the counts to ``joint``; a draw
    outside its support gives 0."""
    import torch
    if set(pairs) - set(joint):
        return 0.0
    cells = sorted(joint)
    observed = np.array([pairs[c] for c in cells], np.float64)
    expected = np.array([joint[c] for c in cells]) * NUM_DRAWS
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def _engine(make_llm):
    return make_llm(speculative_config={"method": "ngram",
                                        "num_speculative_tokens": 1},
                    max_num_seqs=16, max_num_batched_tokens=128).llm_engine


def test_speculative_samples_follow_the_target_distribution(make_llm, exact):
    joint, best = exact
    assert min(joint.values()) * NUM_DRAWS >= 5  # chi-square's usual bound
    pairs, accepted = _draw_pairs(_engine(make_llm), best)
    assert 0 < accepted < NUM_DRAWS  # both branches ran
    assert _p_value(pairs, joint) > ALPHA


def test_an_acceptance_rule_that_accepts_every_draft_is_caught(make_llm, exact):
    joint, best = exact
    engine = _engine(make_llm)
    engine.runner.programs.use_acceptance_rule(
        lambda drafts, targets, num_drafts: num_drafts)
    pairs, accepted = _draw_pairs(engine, best)
    assert accepted == NUM_DRAWS
    assert _p_value(pairs, joint) < ALPHA


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3"])
def test_drafted_samples_follow_the_target_distribution(make_llm, tiny_path,
                                                        spec_case, method):
    """One draft a step, decoded on the device by the draft's own program
    and pages: the target as its own draft model (the draft is the greedy
    second token, as above), or an EAGLE head for its target."""
    target, config = spec_case(method, k=1)
    if method == "draft_model":
        config = draft_config(tiny_path, k=1)
    joint, _ = _exact(target or tiny_path)
    assert min(joint.values()) * NUM_DRAWS >= 5
    engine = make_llm(target, speculative_config=config,
                      max_num_seqs=16, max_num_batched_tokens=128).llm_engine
    pairs = _seeded_pairs(engine)
    stats = engine.get_stats().spec_decode
    assert stats.num_drafts == NUM_DRAWS
    assert 0 < stats.num_accepted_tokens < NUM_DRAWS
    assert _p_value(pairs, joint) > ALPHA
