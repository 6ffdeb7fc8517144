"""vLLM's request fields on the OpenAI server: every field of vLLM 0.11.0's
completion and chat bodies is honoured or refused with a 400 naming the
feature (none is dropped silently), and the fields the engine has work:
prompt_logprobs, echo with logprobs, priority, use_beam_search, best_of,
logprobs=0, stream_options, model="", return_tokens_as_token_ids,
/tokenizer_info, /invocations, logit_bias keys named in the 400."""

from __future__ import annotations

import json

import pytest
import requests

from jaxinfer.compat.request_fields import request_field_status
from jaxinfer.compat.status import Ignored, Refused
from jaxinfer.compat.surface import vllm_surface

from .conftest import start_server

# The in-process and the multi-process server (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.both_servers]


@pytest.fixture(scope="module")
def server(tiny_model_factory, server_mode):
    server, _ = start_server(
        tiny_model_factory(), ["tiny"], server_mode, max_model_len=128,
        num_gpu_blocks_override=256, max_num_seqs=8, max_num_batched_tokens=128,
        scheduling_policy="priority", enable_tokenizer_info_endpoint=True,
        enable_server_load_tracking=True)
    yield server
    server.stop()


def post(server, path, body, stream=False):
    return requests.post(server.base_url + path, json=body, timeout=120,
                         stream=stream)


COMPLETION = {"model": "tiny", "prompt": "one two three", "max_tokens": 3,
              "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3, "temperature": 0}

# A value each supported field is sent with (not its default); the
# behaviour of the ones the issue names is checked by the tests below.
SUPPORTED_VALUES = {
    "model": "tiny", "prompt": "four five", "messages": CHAT["messages"],
    "best_of": 2, "echo": True, "frequency_penalty": 0.5,
    "logit_bias": {"5": 1.0}, "logprobs": 2, "top_logprobs": 2,
    "max_tokens": 2, "max_completion_tokens": 2, "n": 2,
    "presence_penalty": 0.5, "seed": 3, "stop": ["zz"], "stream": False,
    "stream_options": None, "temperature": 0.7, "top_p": 0.9, "user": "u",
    "use_beam_search": True, "top_k": 5, "min_p": 0.1,
    "repetition_penalty": 1.1, "length_penalty": 0.5, "stop_token_ids": [2],
    "include_stop_str_in_output": True, "ignore_eos": True, "min_tokens": 1,
    "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 2, "allowed_token_ids": [5, 6, 7],
    "prompt_logprobs": 1, "add_special_tokens": False, "bad_words": ["zz"],
    "add_generation_prompt": False, "continue_final_message": False,
    "chat_template": None, "chat_template_kwargs": {"x": 1}, "priority": 1,
    "request_id": "my-id", "return_tokens_as_token_ids": True,
    "return_token_ids": True, "parallel_tool_calls": False,
    "include_reasoning": False,
}


def refused_value(entry: Refused):
    return next(v for v in ["bogus", 7, True, {"a": 1}] if not entry.allows(v))


@pytest.mark.parametrize("kind, path, base", [
    ("completion_request", "/v1/completions", COMPLETION),
    ("chat_completion_request", "/v1/chat/completions", CHAT)])
def test_every_vllm_field_is_honoured_or_refused(server, kind, path, base):
    failures = []
    for name in vllm_surface()[kind]:
        entry = request_field_status(kind, name)
        body = dict(base)
        if isinstance(entry, Refused):
            body[name] = refused_value(entry)
            r = post(server, path, body)
            feature = entry.feature.split(" (")[0].lower()
            if r.status_code != 400 or feature not in r.text.lower():
                failures.append((name, r.status_code, r.text[:200]))
            continue
        body[name] = SUPPORTED_VALUES.get(name, base.get(name))
        if kind == "chat_completion_request" and name in ("logprobs",
                                                          "top_logprobs"):
            body["logprobs"] = True
        if name in ("use_beam_search", "length_penalty"):
            body.update(use_beam_search=True, n=2, temperature=0)
        if name == "best_of":
            body.update(temperature=1.0)
        if name == "n":
            body.update(temperature=1.0)
        r = post(server, path, body)
        if r.status_code != 200:
            failures.append((name, r.status_code, r.text[:200]))
        elif isinstance(entry, Ignored):
            assert r.json()["choices"]
    assert not failures, failures


def test_unknown_fields_are_named(server):
    r = post(server, "/v1/completions", {**COMPLETION, "temprature": 0.5})
    assert r.status_code == 400 and "temprature" in r.json()["error"]["message"]


def test_prompt_logprobs_are_returned(server):
    r = post(server, "/v1/completions", {**COMPLETION, "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert len(plp) == n_prompt and plp[0] is None
    assert all(1 <= len(p) <= 3 for p in plp[1:])  # top-2 plus the actual token
    r = post(server, "/v1/chat/completions", {**CHAT, "prompt_logprobs": 0})
    assert r.status_code == 200 and len(r.json()["prompt_logprobs"]) == \
        r.json()["usage"]["prompt_tokens"]
    bad = post(server, "/v1/completions", {**COMPLETION, "prompt_logprobs": -2})
    assert bad.status_code == 400 and "prompt_logprobs" in bad.text
    bad = post(server, "/v1/completions", {**COMPLETION, "prompt_logprobs": 1,
                                           "stream": True})
    assert bad.status_code == 400 and "stream" in bad.text


def test_echo_with_logprobs(server):
    r = post(server, "/v1/completions", {**COMPLETION, "echo": True,
                                         "logprobs": 1}).json()
    lp = r["choices"][0]["logprobs"]
    n_prompt, n_out = r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == n_prompt + n_out
    assert lp["token_logprobs"][0] is None  # the first prompt token has none
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert r["choices"][0]["text"].startswith("one two three")
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]


def test_logprobs_zero_returns_the_sampled_token(server):
    r = post(server, "/v1/completions", {**COMPLETION, "logprobs": 0}).json()
    lp = r["choices"][0]["logprobs"]
    for tok, top in zip(lp["tokens"], lp["top_logprobs"]):
        assert list(top) == [tok]
    r = post(server, "/v1/chat/completions", {**CHAT, "logprobs": True,
                                              "top_logprobs": 0}).json()
    assert r["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


def test_priority_reaches_the_scheduler(server):
    r = post(server, "/v1/completions", {**COMPLETION, "priority": -5})
    assert r.status_code == 200


def test_use_beam_search_on_the_server(server):
    body = {**COMPLETION, "use_beam_search": True, "n": 2, "max_tokens": 4,
            "ignore_eos": True, "logprobs": 0}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2 and choices[0]["text"] != choices[1]["text"]
    score = [sum(c["logprobs"]["token_logprobs"]) for c in choices]
    assert score[0] >= score[1]  # best beam first (length_penalty 1, equal lengths)
    greedy = post(server, "/v1/completions", {**COMPLETION, "max_tokens": 4,
                                              "ignore_eos": True,
                                              "logprobs": 0}).json()
    assert score[0] >= sum(greedy["choices"][0]["logprobs"]["token_logprobs"]) - 1e-4


def test_stream_options(server):
    bad = post(server, "/v1/completions", {**COMPLETION, "stream_options": {
        "include_usage": True}})
    assert bad.status_code == 400 and "stream" in bad.text
    r = post(server, "/v1/completions", {**COMPLETION, "stream": True,
                                         "stream_options": {
                                             "include_usage": True,
                                             "continuous_usage_stats": True}},
             stream=True)
    chunks = [json.loads(x[6:]) for x in r.iter_lines(decode_unicode=True)
              if x.startswith("data: {")]
    assert chunks and all(c.get("usage") for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_empty_model_falls_back_to_the_served_one(server):
    r = post(server, "/v1/completions", {**COMPLETION, "model": ""})
    assert r.status_code == 200 and r.json()["model"] == "tiny"


def test_return_tokens_as_token_ids(server):
    r = post(server, "/v1/completions", {**COMPLETION, "logprobs": 1,
                                         "return_tokens_as_token_ids": True})
    toks = r.json()["choices"][0]["logprobs"]["tokens"]
    assert toks and all(t.startswith("token_id:") for t in toks)


def test_bad_logit_bias_key_is_named(server):
    r = post(server, "/v1/completions", {**COMPLETION,
                                         "logit_bias": {"abc": 1.0}})
    assert r.status_code == 400 and "abc" in r.json()["error"]["message"]


def test_tokenizer_info_invocations_and_token_strs(server):
    info = requests.get(server.base_url + "/tokenizer_info", timeout=10).json()
    assert info["tokenizer_class"] and "eos_token" in info
    r = post(server, "/invocations", COMPLETION)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    r = post(server, "/invocations", CHAT)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = post(server, "/tokenize", {"prompt": "one two", "return_token_strs": True})
    body = r.json()
    assert len(body["token_strs"]) == len(body["tokens"]) == body["count"]
    assert requests.get(server.base_url + "/load", timeout=10).json() == {
        "server_load": 0}  # nothing in flight between requests


def test_request_id_and_return_token_ids(server):
    r = post(server, "/v1/completions", {**COMPLETION, "request_id": "abc",
                                         "return_token_ids": True}).json()
    assert r["id"] == "cmpl-abc"
    choice = r["choices"][0]
    assert len(choice["token_ids"]) == r["usage"]["completion_tokens"]
    assert len(choice["prompt_token_ids"]) == r["usage"]["prompt_tokens"]


def test_best_of_on_the_server(server):
    r = post(server, "/v1/completions", {**COMPLETION, "n": 1, "best_of": 3,
                                         "temperature": 1.0, "seed": 1,
                                         "logprobs": 0}).json()
    assert len(r["choices"]) == 1


def test_chat_echo_and_multimodal_refused(server):
    r = post(server, "/v1/chat/completions", {
        **CHAT, "echo": True, "add_generation_prompt": False,
        "continue_final_message": True,
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "Hello the"}]}).json()
    assert r["choices"][0]["message"]["content"].startswith("Hello the")
    r = post(server, "/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "multimodal" in r.json()["error"]["message"]
