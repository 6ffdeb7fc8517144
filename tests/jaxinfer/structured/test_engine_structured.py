"""Structured outputs on the embedded model through `LLM`: every output
under a JSON schema validates, regex outputs fullmatch, choices are one of
the choices, grammar outputs parse; constrained rows leave the greedy
tokens of unconstrained rows in the same batch unchanged; n > 1,
preemption, chunked prefill and prefix caching keep each sequence's
matcher right."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from jaxinfer import InvalidRequestError, SamplingParams
from jaxinfer.structured import GuidedDecodingParams
from jaxinfer.structured import StructuredOutputsParams as P

from .conftest import EMBEDDED, ask

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "email": {"type": "string", "format": "email"}},
    "required": ["name", "age", "email"], "additionalProperties": False}
# Every field bounded: sampled outputs end well within max_tokens.
BOUNDED = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "city": {"enum": ["Paris", "Rome", "Oslo"]}},
    "required": ["name", "age", "city"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "item": {"type": "string", "enum": ["book", "pen", "lamp"]},
    "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
    "gift": {"type": "boolean"},
    "address": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city", "zip"], "additionalProperties": False},
    "notes": {"type": "array", "items": {"type": "string", "maxLength": 10},
              "maxItems": 2}},
    "required": ["item", "quantity", "gift", "address", "notes"],
    "additionalProperties": False}
ARITH_GBNF = ('root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
              'term ::= [1-9] [0-9]?')


def _params(so, **kw):
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", 120)
    return SamplingParams(structured_outputs=so, **kw)


def test_json_schema_outputs_validate(embedded_llm):
    prompts = ["Describe a person as JSON.", "Who wrote Hamlet? Answer in JSON.",
               "Make up an order for a shop as JSON.", "Order two pens."]
    cases = [(PERSON, p) for p in prompts[:2]] + [(ORDER, p) for p in prompts[2:]]
    params = [_params(P(json=s, disable_any_whitespace=i % 2 == 1),
                      temperature=0.0 if i < 2 else 0.8, seed=i)
              for i, (s, _) in enumerate(cases)]
    outs = ask(embedded_llm, [p for _, p in cases], params)
    for (schema, _), (text, reason) in zip(cases, outs):
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), schema)


def test_json_object_regex_choice_grammar(embedded_llm):
    regex = r"[A-Z][a-z]{2,9}, [0-9]{4}"
    params = [_params(P(json_object=True)),
              _params(P(regex=regex)),
              _params(P(choice=["positive", "negative", "neutral"])),
              _params(P(grammar=ARITH_GBNF)),
              SamplingParams(temperature=0.0, max_tokens=40,
                             guided_decoding=GuidedDecodingParams(
                                 choice=["Paris", "Rome"]))]
    prompts = ['Repeat exactly: {"color": "red"}',
               "Name a city and a year.",
               "Sentiment of: I love this film!",
               "Write a sum of small numbers.",
               "What is the capital of France?"]
    (obj, r0), (rx, r1), (ch, r2), (gr, r3), (gd, r4) = ask(
        embedded_llm, prompts, params)
    assert [r0, r1, r2, r3, r4] == ["stop"] * 5, (obj, rx, ch, gr, gd)
    assert isinstance(json.loads(obj), dict)
    assert re.fullmatch(regex, rx), rx
    assert ch in ("positive", "negative", "neutral")
    assert re.fullmatch(r"[1-9][0-9]?([+-][1-9][0-9]?)*", gr), gr
    eval(gr)  # parses as arithmetic
    assert gd in ("Paris", "Rome")


def test_unconstrained_rows_keep_their_greedy_tokens(embedded_llm):
    prompts = ["Tell me a fact about the moon.", "Count to five.",
               "Say hello in French."]
    plain = SamplingParams(temperature=0.0, max_tokens=24)
    alone = ask(embedded_llm, prompts, [plain] * 3)
    mixed_params = [plain, _params(P(json=PERSON)), plain,
                    _params(P(choice=["a", "b"])), plain]
    mixed = ask(embedded_llm, [prompts[0], "A person as JSON.", prompts[1],
                               "Pick a or b.", prompts[2]], mixed_params)
    assert [mixed[0], mixed[2], mixed[4]] == alone


def test_n_samples_each_follow_the_grammar(embedded_llm):
    outs = embedded_llm.chat(
        [[{"role": "user", "content": "Describe a person as JSON."}]],
        _params(P(json=BOUNDED, disable_any_whitespace=True), n=3,
                temperature=1.0, seed=7), use_tqdm=False)
    texts = [c.text for c in outs[0].outputs]
    assert len(texts) == 3
    for c in outs[0].outputs:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), BOUNDED)


def test_refused_schema_is_a_typed_error(embedded_llm):
    with pytest.raises(InvalidRequestError, match="not"):
        embedded_llm.generate(["x"], _params(P(json={"not": {}})),
                              use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="matches no text"):
        embedded_llm.generate(["x"], _params(P(regex="[^\\s\\S]")),
                              use_tqdm=False)


def test_preemption_chunked_prefill_prefix_cache(xla_cache):
    """Few pages and short steps: requests are preempted and recomputed,
    prompts are prefilled in chunks and share cached prefixes, and every
    matcher still follows its own sequence."""
    from jaxinfer import LLM
    llm = LLM(EMBEDDED, max_model_len=256, max_num_seqs=8,
              max_num_batched_tokens=32, num_gpu_blocks_override=18,
              block_size=16, enable_prefix_caching=True,
              compilation_cache_dir=xla_cache)
    shared = ("You are a registry clerk. Every answer is one JSON object "
              "with a name, an age and a city, nothing else. " * 3)
    prompts = [f"{shared}Describe person number {i}." for i in range(8)]
    outs = ask(llm, prompts, [_params(P(json=BOUNDED, disable_any_whitespace=True),
                                      temperature=0.9, seed=i)
                              for i in range(8)])
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.scheduler.kv.prefix_cache_hits > 0
    for text, reason in outs:
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), BOUNDED)


def test_masks_fill_while_the_step_before_is_in_flight(embedded_llm, xla_cache,
                                                      monkeypatch):
    """Under async scheduling a batch under grammars keeps the host/device
    overlap: each step's masks are filled after its forward pass is
    enqueued, once the step before has been read; the tokens equal those
    of the plain loop, which reads every step before scheduling the next."""
    from jaxinfer import LLM
    engine = embedded_llm.llm_engine
    overlapped = []
    fill = engine._fill_token_masks

    def spy(sched_out, bitmask):
        overlapped.append(engine._inflight is not None)
        fill(sched_out, bitmask)

    monkeypatch.setattr(engine, "_fill_token_masks", spy)
    prompts = ["Describe a person as JSON.", "Make up an order as JSON.",
               "Pick a or b.", "Count to three."]
    params = [_params(P(json=BOUNDED)), _params(P(json=ORDER)),
              _params(P(choice=["a", "b"])), _params(None, max_tokens=20)]
    got = ask(embedded_llm, prompts, params)
    assert any(overlapped) and engine.args.async_scheduling
    plain = LLM(EMBEDDED, max_model_len=512, max_num_seqs=16,
                max_num_batched_tokens=256, compilation_cache_dir=xla_cache,
                async_scheduling=False)
    assert ask(plain, prompts, params) == got
    jsonschema.validate(json.loads(got[0][0]), BOUNDED)
    jsonschema.validate(json.loads(got[1][0]), ORDER)
