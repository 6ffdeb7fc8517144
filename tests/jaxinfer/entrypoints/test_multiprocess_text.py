"""The multi-process server's text is made by its front ends from the
engine core's token ids: the same text, finish and stop reasons and
logprob tokens as `LLM.generate`, streamed or not, and a stop string
found by a front end ends the request in the core (its pages freed, no
more tokens generated)."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.stop_strings import stop_inside_one_token, stop_spanning_tokens, token_text_ends

from .test_lifecycle import Launched
from .test_multiprocess_server import ENGINE_KWARGS

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time"
GREEDY = dict(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def mp_server(tiny_model_factory, tmp_path_factory):
    server = Launched(tiny_model_factory(), tmp_path_factory.mktemp("mp-text"),
                      mode="2")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    from jaxinfer import LLM
    return LLM(model=tiny_model_factory(), **ENGINE_KWARGS)


@pytest.fixture(scope="module")
def stops(llm):
    """(stop inside one token, stop across two) of the greedy text."""
    from jaxinfer import SamplingParams
    out = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)[0]
    text = out.outputs[0].text
    ends = token_text_ends(llm.llm_engine.tokenizer, out.prompt_token_ids,
                           out.outputs[0].token_ids)
    inside, across = stop_inside_one_token(text, ends), stop_spanning_tokens(text, ends)
    if inside is None or across is None:
        pytest.skip("the reference text has no such stop strings")
    return inside, across


def complete(server, body: dict, stream: bool) -> list[dict]:
    """Each choice of a completion as {text, finish_reason, stop_reason,
    tokens}, put together from the stream's chunks when streamed."""
    body = dict(body, model="tiny", prompt=PROMPT, stream=stream)
    r = requests.post(server.base_url + "/v1/completions", json=body,
                      timeout=120, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        chunks = r.json()["choices"]
    else:
        chunks = [c for line in r.iter_lines() if line
                  and line.startswith(b"data: ") and line != b"data: [DONE]"
                  for c in json.loads(line[6:])["choices"]]
    choices: dict[int, dict] = {}
    for c in chunks:
        got = choices.setdefault(c["index"], dict(text="", finish_reason=None,
                                                  stop_reason=None, tokens=[]))
        got["text"] += c["text"]
        got["tokens"] += (c.get("logprobs") or {}).get("tokens") or []
        if c.get("finish_reason") is not None:
            got["finish_reason"] = c["finish_reason"]
            got["stop_reason"] = c.get("stop_reason")
    return [choices[i] for i in sorted(choices)]


def expected(llm, **params) -> list[dict]:
    from jaxinfer import SamplingParams
    out = llm.generate(PROMPT, SamplingParams(**params), use_tqdm=False)[0]
    return [dict(text=c.text, finish_reason=c.finish_reason,
                 stop_reason=c.stop_reason,
                 tokens=[lp[t].decoded_token for lp, t in
                         zip(c.logprobs or [], c.token_ids)])
            for c in out.outputs]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_match_llm_generate(mp_server, llm, stops, stream, include):
    for stop in stops:
        body = dict(GREEDY, stop=[stop], include_stop_str_in_output=include,
                    logprobs=1)
        want = expected(llm, **dict(body, logprobs=1))
        assert want[0]["stop_reason"] == stop
        assert complete(mp_server, body, stream) == want


@pytest.mark.parametrize("stream", [False, True])
def test_two_samples_match_llm_generate(mp_server, llm, stops, stream):
    body = dict(temperature=1.0, seed=5, n=2, max_tokens=24, ignore_eos=True,
                stop=list(stops))
    assert complete(mp_server, body, stream) == expected(llm, **body)


def metric(server, name: str, label: str = "") -> float:
    text = requests.get(server.base_url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line)


def test_stop_string_ends_the_request_in_the_core(mp_server, llm, stops):
    """A stop string early in a 400-token request: the core stops
    generating for it and frees its pages; it counts as stopped."""
    body = dict(GREEDY, max_tokens=400, stop=[stops[0]])
    generated = metric(mp_server, "jaxinfer:generation_tokens_total")
    stopped = metric(mp_server, "jaxinfer:request_success_total",
                     'finished_reason="stop"')
    got = complete(mp_server, body, stream=True)
    assert got[0]["stop_reason"] == stops[0]
    time.sleep(1.0)  # the core has had many steps to run on, were it to
    assert 0 < metric(mp_server, "jaxinfer:generation_tokens_total") - generated < 100
    assert metric(mp_server, "jaxinfer:kv_cache_usage_perc") == 0
    assert metric(mp_server, "jaxinfer:num_requests_running") == 0
    assert metric(mp_server, "jaxinfer:request_success_total",
                  'finished_reason="stop"') == stopped + 1
