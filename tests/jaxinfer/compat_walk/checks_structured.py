"""Behaviour checks of the structured-output rows: each constraint's
output follows it (the walk's random-weight model would not produce these
texts unconstrained), through the offline LLM and both request bodies."""

from __future__ import annotations

import json
import re

import pytest

from .checks_sampling import ALL, BODIES, HOT, PROMPT, on
from .registry import row_check

FIELDS = dict(temperature=HOT, seed=1, max_tokens=12)


@on(ALL, "structured_outputs")
def structured_outputs_constrain_the_text(surface):
    free = surface.run(PROMPT, **FIELDS)[0].text
    assert free not in ("yes", "no")
    out = surface.run(PROMPT, structured_outputs={"choice": ["yes", "no"]},
                      **FIELDS)[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


@row_check("sampling_params", "guided_decoding")
def guided_decoding_is_taken_as_structured_outputs(surface):
    out = surface.run(PROMPT, guided_decoding={"regex": "[0-9]{3}"},
                      **FIELDS)[0]
    assert re.fullmatch("[0-9]{3}", out.text)


@on(BODIES, "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "response_format")
def guided_fields_constrain_the_text(surface):
    schema = {"type": "object", "properties": {"k": {"enum": [1, 2]}},
              "required": ["k"], "additionalProperties": False}
    text = surface.run(PROMPT, guided_json=schema,
                       guided_whitespace_pattern="", **FIELDS)[0].text
    assert json.loads(text) in ({"k": 1}, {"k": 2}) and " " not in text
    text = surface.run(PROMPT, guided_regex="[a-c]{4}",
                       guided_decoding_backend="guidance", **FIELDS)[0].text
    assert re.fullmatch("[a-c]{4}", text)
    assert surface.run(PROMPT, guided_choice=["up", "down"],
                       **FIELDS)[0].text in ("up", "down")
    text = surface.run(PROMPT, guided_grammar='root ::= "x" [0-9]',
                       **FIELDS)[0].text
    assert re.fullmatch("x[0-9]", text)
    text = surface.run(PROMPT, response_format={
        "type": "json_schema", "json_schema": {
            "name": "k", "schema": {"enum": ["left", "right"]}}},
        **FIELDS)[0].text
    assert json.loads(text) in ("left", "right")


@row_check("engine_args", "guided_decoding_backend",
           "structured_outputs_config")
def backend_names_llguidance_or_is_refused():
    from jaxinfer import EngineArgs
    from jaxinfer.errors import InvalidConfigError, UnsupportedFeatureError
    EngineArgs(guided_decoding_backend="guidance",
               structured_outputs_config='{"backend": "llguidance"}')
    # vLLM's other backends are a missing feature; an unknown name is a typo.
    with pytest.raises(UnsupportedFeatureError, match="llguidance"):
        EngineArgs(guided_decoding_backend="xgrammar")
    with pytest.raises(UnsupportedFeatureError, match="llguidance"):
        EngineArgs(structured_outputs_config='{"backend": "outlines"}')
    with pytest.raises(InvalidConfigError, match="llguidance"):
        EngineArgs(guided_decoding_backend="xgrammer")
    with pytest.raises(InvalidConfigError, match="backend"):
        EngineArgs(structured_outputs_config='{"reasoning_parser": "x"}')
