"""Grammar compilation, its cache and typed errors, and the packed masks'
application in the sampler (no model)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.structured import GuidedDecodingParams
from jaxinfer.structured import StructuredOutputsParams as P
from jaxinfer.structured.bitmask import allowed, fill_bitmasks, words
from jaxinfer.structured.grammar import GrammarCompiler, InvalidStructuredOutputError
from jaxinfer.worker.sampler import apply_token_bitmask
from tests.tiny_models import VOCAB, embedded_tokenizer


@pytest.fixture(scope="module")
def compiler():
    tok = embedded_tokenizer()
    return GrammarCompiler(tok, VOCAB, [tok.eos_token_id])


def _walk(compiler, params, text):
    """Feeds ``text``'s tokens through a fresh matcher, checking each is in
    the mask first; returns the matcher."""
    m = compiler.compile(params).matcher()
    for t in embedded_tokenizer().encode(text, add_special_tokens=False):
        assert allowed(fill_bitmasks([m])[0], t)
        assert m.accept(t)
    return m


@pytest.mark.parametrize("params, text", [
    (P(json={"type": "object", "properties": {"a": {"type": "integer"}},
             "required": ["a"]}, disable_any_whitespace=True), '{"a":12}'),
    (P(regex=r"[a-z]+-[0-9]{2}"), "abc-42"),
    (P(choice=["red", "green"]), "green"),
    (P(grammar='root ::= "a" "b"+'), "abbb"),
    (P(json_object=True), '{"x": [1, 2]}'),
])
def test_valid_text_walks_to_the_end(compiler, params, text):
    m = _walk(compiler, params, text)
    assert m.error is None


def test_finished_only_at_the_end(compiler):
    m = compiler.compile(P(choice=["yes"])).matcher()
    assert not m.finished
    for t in embedded_tokenizer().encode("yes", add_special_tokens=False):
        m.accept(t)
    assert m.finished


def test_compiled_once_per_spec(compiler):
    before = compiler.compiles
    a = compiler.compile(P(regex="x[0-9]+y"))
    b = compiler.compile(P(regex="x[0-9]+y"))
    assert a is b and compiler.compiles == before + 1
    compiler.compile(P(regex="x[0-9]+z"))
    assert compiler.compiles == before + 2


def test_a_refused_token_leaves_the_mask(compiler):
    m = compiler.compile(P(choice=["yes", "no"])).matcher()
    row = fill_bitmasks([m])[0]
    tok = embedded_tokenizer()
    assert allowed(row, tok.encode("yes", add_special_tokens=False)[0])
    assert not allowed(row, tok.encode("maybe", add_special_tokens=False)[0])
    assert row.shape == (words(VOCAB),)


@pytest.mark.parametrize("params, words_in_message", [
    (P(regex="(?=a)b"), "regex"),
    (P(regex="a[^\\s\\S]b"), "matches no text"),
    (P(json={"type": "integer", "minimum": 5, "maximum": 2}), "Unsatisfiable"),
    (P(json={"not": {"type": "string"}}), "not"),
    (P(grammar="start: undefined_rule"), "undefined_rule"),
    (P(structural_tag='{"structures": []}'), "structural_tag"),
])
def test_refused_specs_raise_typed_errors(compiler, params, words_in_message):
    with pytest.raises(InvalidStructuredOutputError, match=words_in_message):
        compiler.compile(params)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one"),
    ({"json": {}, "regex": "a"}, "exactly one"),
    ({"choice": []}, "non-empty list"),
    ({"json": "{not json"}, "does not parse"),
    ({"grammar": "  "}, "non-empty"),
])
def test_params_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        P(**kwargs)


def test_guided_decoding_backend_checked():
    assert GuidedDecodingParams(regex="a", backend="guidance").structured().regex == "a"
    with pytest.raises(ValueError, match="llguidance"):
        GuidedDecodingParams(regex="a", backend="xgrammar")


def test_apply_token_bitmask_matches_reference():
    rng = np.random.default_rng(0)
    S, V = 3, 100
    logits = rng.normal(size=(S, V)).astype(np.float32)
    keep = rng.random((S, V)) < 0.3
    keep[2] = True  # an unconstrained row
    packed = np.zeros((S, words(V)), np.uint32)
    for r, t in zip(*np.nonzero(keep)):
        packed[r, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    packed[2] = 0xFFFFFFFF
    out = np.asarray(apply_token_bitmask(jnp.asarray(logits),
                                         jnp.asarray(packed.view(np.int32))))
    np.testing.assert_array_equal(out, np.where(keep, logits, -np.inf))
