"""No request shape adds a step program: requests mixing every sampling
field at widths from 1 to the vocabulary run only programs of the set
`StepPrograms` enumerates at start, and after warm-up compile nothing."""

from __future__ import annotations

import random

import pytest

from jaxinfer import SamplingParams
from jaxinfer.errors import InvalidRequestError
from jaxinfer.worker.sampler_widths import bias_widths
from tests.compile_events import compile_events
from tests.tiny_models import VOCAB


def random_params(rng: random.Random, vocab: int) -> SamplingParams:
    """Every sampling field the engine serves, each on or off at random,
    list widths drawn from 1 to the vocabulary (log-uniform)."""
    def width() -> int:
        return min(vocab, int(2 ** rng.uniform(0, vocab.bit_length())))

    kw: dict = dict(max_tokens=rng.randrange(1, 6), seed=rng.randrange(1000))
    if rng.random() < 0.7:
        kw["temperature"] = rng.choice([0.5, 1.0])
        kw.update(rng.choice([{}, {"top_k": rng.randrange(1, vocab)},
                              {"top_p": 0.8}, {"min_p": 0.05},
                              {"top_k": 5, "top_p": 0.9, "min_p": 0.1}]))
        if rng.random() < 0.2:
            kw["n"] = 2
    else:
        kw["temperature"] = 0.0
    if rng.random() < 0.3:
        kw["logit_bias"] = {t: rng.uniform(-5, 5)
                            for t in rng.sample(range(vocab), width())}
    if rng.random() < 0.3:
        kw["allowed_token_ids"] = rng.sample(range(vocab), width())
    if rng.random() < 0.2:
        kw["bad_words"] = [rng.choice(["the", "a b", "hello world"])]
    if rng.random() < 0.2:
        kw["min_tokens"] = rng.randrange(1, kw["max_tokens"] + 1)
    for field in ("presence_penalty", "frequency_penalty"):
        if rng.random() < 0.2:
            kw[field] = rng.uniform(-1, 1)
    if rng.random() < 0.2:
        kw["repetition_penalty"] = rng.uniform(0.8, 1.3)
    if rng.random() < 0.3:
        kw["logprobs"] = rng.randrange(0, 21)
    if rng.random() < 0.2:
        kw["prompt_logprobs"] = rng.randrange(0, 21)
    if rng.random() < 0.2:
        kw["stop_token_ids"] = rng.sample(range(vocab), width() % 40 + 1)
    if rng.random() < 0.1:
        kw["stop"] = ["\n", "zz"]
    return SamplingParams(**kw)


def drive(engine, n: int, seed: int) -> None:
    rng = random.Random(seed)
    added = 0
    while added < n or engine.has_unfinished_requests():
        while added < n and rng.random() < 0.5:
            prompt = [rng.randrange(3, VOCAB)
                      for _ in range(rng.randrange(1, 60))]
            engine.add_request(None, {"prompt_token_ids": prompt},
                               random_params(rng, VOCAB))
            added += 1
        engine.step()


def assert_within_set(programs) -> None:
    known = programs.known_keys()
    assert known, "no enumerated program set"
    assert programs.num_outside == 0
    assert programs.keys_run <= known, programs.keys_run - known
    assert programs.num_programs <= len(known)


@pytest.mark.slow
def test_no_request_shape_compiles_after_warmup(make_llm):
    engine = make_llm(warmup=True).llm_engine
    programs = engine.runner.programs
    assert set(programs.built) == programs.known_keys()
    with compile_events() as events:
        drive(engine, 150, seed=0)
    assert events == [], f"{len(events)} compilations after warm-up"
    assert_within_set(programs)
    # Every sampler tier was reached: the full tier at several widths.
    widths = {key.inputs.leaves for key in programs.keys_run
              if key.kind == "sample"}
    assert len(widths) > 3
    stats = engine.get_stats()
    assert stats.num_step_programs == programs.num_programs
    assert stats.num_known_step_programs == len(programs.known_keys())


def test_without_warmup_programs_build_within_the_set(make_llm):
    engine = make_llm(warmup=False).llm_engine
    programs = engine.runner.programs
    drive(engine, 40, seed=1)
    assert_within_set(programs)
    assert any(key.kind == "prompt_logprobs" for key in programs.keys_run)


def test_the_set_is_bounded_by_buckets_and_widths(make_llm):
    """The enumerated set's size follows from the buckets and the fixed
    widths alone: forward per bucket (and its prompt-logprob variant for
    prefill buckets), 3 plain and one full sampler per bias width per S,
    prompt logprobs per T, one count."""
    programs = make_llm(warmup=False).llm_engine.runner.programs
    shapes = programs.buckets.all_shapes()
    prefill = [b for b in shapes if not b.decode_only]
    seqs = {b.seqs for b in shapes}
    tokens = {b.tokens for b in shapes}
    expected = (len(shapes) + len(prefill)
                + len(seqs) * (3 + len(bias_widths(VOCAB)))
                + len(tokens) + 1)
    assert len(programs.known_keys()) == expected


def test_lists_longer_than_the_vocabulary_are_refused(make_llm):
    engine = make_llm(warmup=False).llm_engine
    for field, value in (("allowed_token_ids", [5] * (VOCAB + 1)),):
        with pytest.raises(InvalidRequestError, match=f"{field}.*{VOCAB}"):
            engine.add_request(None, {"prompt_token_ids": [5, 6]},
                               SamplingParams(**{field: value}))
    # Up to the vocabulary is served.
    engine.add_request(None, {"prompt_token_ids": [5, 6]},
                       SamplingParams(max_tokens=1,
                                      allowed_token_ids=list(range(VOCAB))))
    while engine.has_unfinished_requests():
        engine.step()
