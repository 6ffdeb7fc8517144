"""Random bounded JSON schemas (hypothesis) on the embedded model, all in
one generate call: each schema is refused with a typed error or gives an
output that parses and validates; none may be cut short by max_tokens
(the schemas are bounded so that a complete output always fits)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer import SamplingParams
from jaxinfer.structured import StructuredOutputsParams
from jaxinfer.structured.grammar import InvalidStructuredOutputError

NUM_SCHEMAS = 200
NAMES = st.sampled_from(["a", "b", "id", "name", "tag", "n"])

leaf = st.one_of(
    st.integers(1, 5).map(lambda n: {"type": "string", "maxLength": n}),
    st.tuples(st.integers(-50, 0), st.integers(0, 99)).map(
        lambda b: {"type": "integer", "minimum": b[0], "maximum": b[1]}),
    st.lists(st.sampled_from(["x", "yes", "no", "red", 3, True]), min_size=1,
             max_size=3, unique=True).map(lambda v: {"enum": v}),
    st.just({"type": "boolean"}),
)
array = leaf.flatmap(lambda item: st.integers(1, 2).map(
    lambda n: {"type": "array", "items": item, "maxItems": n}))


def obj(values, max_props):
    return st.dictionaries(NAMES, values, min_size=1, max_size=max_props).map(
        lambda props: {"type": "object", "properties": props,
                       "required": sorted(props), "additionalProperties": False})


# Depth at most 2: an object of leaves, arrays and objects of leaves.
schemas = obj(st.one_of(leaf, array, obj(st.one_of(leaf, array), 2)), 3)


@pytest.mark.slow
@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.lists(schemas, min_size=NUM_SCHEMAS, max_size=NUM_SCHEMAS))
def test_random_schemas_give_valid_output_or_a_typed_error(embedded_llm, drawn):
    grammars = embedded_llm.llm_engine.input_processor.grammars
    accepted = []
    for schema in drawn:
        params = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
        try:
            grammars.compile(params)
        except InvalidStructuredOutputError:
            continue  # refused with a typed error: allowed
        accepted.append((schema, params))
    assert len(accepted) > NUM_SCHEMAS // 2  # the strategy stays in coverage
    outs = embedded_llm.chat(
        [[{"role": "user", "content": f"Fill in JSON: {json.dumps(s)}"}]
         for s, _ in accepted],
        [SamplingParams(temperature=0, max_tokens=200, structured_outputs=p)
         for _, p in accepted], use_tqdm=False)
    cut = [o.outputs[0].text for o in outs if o.outputs[0].finish_reason != "stop"]
    assert not cut, f"{len(cut)} outputs cut short: {cut[:3]}"
    for (schema, _), out in zip(accepted, outs):
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
