"""How the walk drives a refused or an ignored row of each table: with a
value the entry does not accept, a refused row must raise
UnsupportedFeatureError (the server: answer 400) naming the missing
feature; an ignored row must log its reason and change nothing (the same
EngineArgs / SamplingParams / response as without it)."""

from __future__ import annotations

import logging

import pytest
import requests

from jaxinfer.compat.status import Refused
from jaxinfer.compat.surface import vllm_surface
from jaxinfer.errors import UnsupportedFeatureError

from .surfaces import MODEL

BODIES = {"completion_request": ("/v1/completions", {
              "model": MODEL, "prompt": "one two", "max_tokens": 3,
              "temperature": 0}),
          "chat_completion_request": ("/v1/chat/completions", {
              "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
              "max_tokens": 3, "temperature": 0}),
          "tokenize_chat": ("/tokenize", {
              "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})}


def refused_value(entry: Refused, strings_only: bool = False):
    """A value the entry does not accept (so it must be refused)."""
    candidates = ["bogus-value", "7"] + ([] if strings_only else
                                         [True, {"a": 1}, 7])
    return next(v for v in candidates if not entry.allows(v))


def names_feature(entry: Refused, message: str) -> bool:
    return entry.feature.split(" (")[0].lower() in message.lower()


def _serve_argv(dest: str, value):
    flag = next(f for f in vllm_surface()["serve_flags"] if f["dest"] == dest)
    return ["serve", "m", flag["flags"][0]] + ([str(value)] if flag["takes_value"]
                                               else [])


def _serve_args(argv):
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    return serve_engine_args(build_parser().parse_args(argv))


def serve_flag(row, entry, caplog, request):
    if isinstance(entry, Refused):
        with pytest.raises(UnsupportedFeatureError) as e:
            _serve_args(_serve_argv(row, refused_value(entry, True)))
        assert names_feature(entry, str(e.value)), str(e.value)
        return
    with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
        args = _serve_args(_serve_argv(row, "7"))
    assert entry.reason in caplog.text
    assert args == _serve_args(["serve", "m"])  # nothing reaches the engine


def engine_arg(row, entry, caplog, request):
    from jaxinfer import LLM
    from jaxinfer.engine.llm_engine import LLMEngine
    built = []
    mp = request.getfixturevalue("monkeypatch")
    mp.setattr(LLMEngine, "from_engine_args", built.append)  # loads nothing
    if isinstance(entry, Refused):
        with pytest.raises(UnsupportedFeatureError) as e:
            LLM("m", **{row: refused_value(entry)})
        assert names_feature(entry, str(e.value)) and not built
        return
    with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
        LLM("m", **{row: True})
    LLM("m")
    assert entry.reason in caplog.text and built[0] == built[1]


def sampling_field(row, entry, caplog, request):
    from jaxinfer import SamplingParams
    if isinstance(entry, Refused):
        with pytest.raises(UnsupportedFeatureError) as e:
            SamplingParams(**{row: refused_value(entry)})
        assert names_feature(entry, str(e.value))
        return
    with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
        params = SamplingParams(**{row: 3})
    assert entry.reason in caplog.text and params == SamplingParams()


def body_field(table):
    path, base = BODIES[table]

    def drive(row, entry, caplog, request):
        url = request.getfixturevalue("server_url")
        if isinstance(entry, Refused):
            r = requests.post(url + path, json={**base, row: refused_value(entry)},
                              timeout=120)
            assert r.status_code == 400 and names_feature(entry, r.text), r.text
            return
        value = {"user": "someone", "include_reasoning": True,
                 "parallel_tool_calls": True}[row]
        with caplog.at_level(logging.DEBUG, logger="jaxinfer.compat"):
            r = requests.post(url + path, json={**base, row: value}, timeout=120)
        plain = requests.post(url + path, json=base, timeout=120)
        assert entry.reason in caplog.text
        assert r.status_code == plain.status_code == 200
        assert r.json()["choices"] == plain.json()["choices"]
    return drive


# Table key -> its driver(row key, entry, caplog, request).
DRIVERS = {"serve_flags": serve_flag, "engine_args": engine_arg,
           "sampling_params": sampling_field,
           **{t: body_field(t) for t in BODIES}}
