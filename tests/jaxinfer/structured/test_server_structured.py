"""Structured outputs through `jaxinfer serve`'s app with the official
openai client: response_format (json_object, json_schema), the
beta.chat.completions.parse helper with a pydantic model, vLLM's
structured_outputs / guided_* fields, and 400s in OpenAI's error shape."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from tests.jaxinfer.entrypoints.conftest import openai_client, start_server

from .conftest import EMBEDDED

CITY = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "country": {"enum": ["France", "Italy", "Japan"]}},
    "required": ["city", "country"], "additionalProperties": False}


class Capital(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    population_millions: int = pydantic.Field(ge=0, le=100)


@pytest.fixture(scope="module")
def client(xla_cache):
    server, _ = start_server(EMBEDDED, max_model_len=512, max_num_seqs=8,
                             max_num_batched_tokens=256,
                             compilation_cache_dir=xla_cache)
    yield openai_client(server)
    server.stop()


def _chat(client, content, **kw):
    return client.chat.completions.create(
        model=EMBEDDED, messages=[{"role": "user", "content": content}],
        temperature=0, max_tokens=80, **kw)


def test_response_format_json_schema(client):
    r = _chat(client, "Which city is the capital of France? Answer in JSON.",
              response_format={"type": "json_schema", "json_schema": {
                  "name": "city", "schema": CITY, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)


def test_response_format_json_object(client):
    r = _chat(client, 'Repeat exactly: {"ok": true}',
              response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_helper_with_pydantic(client):
    r = client.beta.chat.completions.parse(
        model=EMBEDDED, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "The capital of Japan and its "
                   "population in millions, as JSON."}],
        response_format=Capital)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital) and 0 <= parsed.population_millions <= 100


def test_vllm_fields(client):
    r = client.completions.create(
        model=EMBEDDED, prompt="The answer is", max_tokens=20, temperature=0,
        extra_body={"guided_regex": r"(yes|no), [0-9]{2}"})
    assert re.fullmatch(r"(yes|no), [0-9]{2}", r.choices[0].text)
    r = _chat(client, "Pick a color.", extra_body={
        "structured_outputs": {"choice": ["red", "blue"]}})
    assert r.choices[0].message.content in ("red", "blue")
    r = _chat(client, "Pick a color.", extra_body={
        "guided_choice": ["green", "black"], "guided_decoding_backend": "guidance"})
    assert r.choices[0].message.content in ("green", "black")
    stream = _chat(client, "Describe Rome as JSON.", stream=True,
                   extra_body={"guided_json": CITY})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), CITY)


@pytest.mark.parametrize("body, param", [
    ({"guided_json": {"not": {}}}, None),
    ({"guided_regex": "[^\\s\\S]"}, None),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"guided_choice": ["a"], "guided_decoding_backend": "xgrammar"},
     "guided_decoding_backend"),
    ({"structured_outputs": {"regex": "a", "bogus": 1}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema"}}, None),
])
def test_typed_400s(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, "x", extra_body=body)
    assert e.value.status_code == 400
    err = e.value.body
    assert err.get("message") and err.get("type")
    if param is not None:
        assert err.get("param") == param
