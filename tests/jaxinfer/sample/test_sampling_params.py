"""Every invalid SamplingParams value raises a ValueError naming the field
(and the range allowed); vLLM's defaults and spellings hold."""

from __future__ import annotations

import pytest

from jaxinfer.sampling_params import RequestOutputKind, SamplingParams

INVALID = [
    ("n", 0), ("n", 1.5), ("temperature", -0.1), ("temperature", "hot"),
    ("top_p", 0.0), ("top_p", 1.01), ("top_k", -2), ("top_k", 2.5),
    ("min_p", -0.1), ("min_p", 1.5), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.1), ("repetition_penalty", 0.0),
    ("max_tokens", 0), ("min_tokens", -1), ("logprobs", -2),
    ("prompt_logprobs", -3), ("seed", 1.5), ("stop", [""]), ("stop", [3]),
    ("stop_token_ids", [-1]), ("bad_words", [""]), ("logit_bias", {"a": 1.0}),
    ("logit_bias", {3: "x"}), ("allowed_token_ids", []),
    ("allowed_token_ids", [-5]), ("output_kind", "delta"),
]


@pytest.mark.parametrize("field,value", INVALID)
def test_invalid_value_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_messages_say_the_allowed_range():
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-1)


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=3)


def test_greedy_allows_one_sample_only():
    with pytest.raises(ValueError, match="n must be 1"):
        SamplingParams(n=2, temperature=0.0)


def test_unknown_fields_are_value_errors():
    with pytest.raises(ValueError, match="unknown sampling fields: tempreature"):
        SamplingParams(tempreature=0.5)
    with pytest.raises(ValueError, match="best_of_n"):
        SamplingParams.from_optional(best_of_n=2, temperature=None)


def test_model_dependent_checks():
    sp = SamplingParams(logprobs=6)
    with pytest.raises(ValueError, match=r"logprobs must be <= max_logprobs \(5"):
        sp.verify_for_model(vocab_size=100, max_logprobs=5)
    # vLLM's -1: the whole vocabulary, bounded by max_logprobs like any other
    with pytest.raises(ValueError, match="whole vocabulary"):
        SamplingParams(logprobs=-1).verify_for_model(100, 20)
    every = SamplingParams(prompt_logprobs=-1)
    every.verify_for_model(100, 100)
    assert every.prompt_logprobs == 100
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[5, 100]).verify_for_model(100, 20)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={100: 1.0}).verify_for_model(100, 20)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=101).verify_for_model(100, 20)
    SamplingParams(logprobs=5, top_k=100).verify_for_model(100, 5)


def test_vllm_defaults_and_normalization():
    sp = SamplingParams()
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert sp.max_tokens == 16 and sp.output_kind == RequestOutputKind.CUMULATIVE
    assert SamplingParams(top_k=-1).top_k == 0  # -1 also means off
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(logit_bias={"5": 1}).logit_bias == {5: 1.0}
    greedy = SamplingParams(temperature=0, top_k=5, top_p=0.5, min_p=0.2)
    assert (greedy.top_k, greedy.top_p, greedy.min_p) == (0, 1.0, 0.0)
    assert SamplingParams.from_optional(temperature=None).temperature == 1.0
