"""Behaviour checks of the request fields that only the OpenAI server has
(the sampling fields are in checks_sampling.py): prompts and messages,
echo, streaming and its options, token ids, priority, request ids, and
the /tokenize and /detokenize bodies. All against the walk's tiny server."""

from __future__ import annotations

import json

import requests

from .registry import row_check
from .surfaces import MODEL

COMPLETION = {"model": MODEL, "prompt": "one two three", "max_tokens": 4,
              "temperature": 0, "ignore_eos": True}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "temperature": 0, "ignore_eos": True}
C, CH = "completion_request", "chat_completion_request"


def post(url, path, body, stream=False):
    r = requests.post(url + path, json=body, timeout=300, stream=stream)
    if not stream:
        assert r.status_code == 200, (body, r.text)
        return r.json()
    return [json.loads(x[6:]) for x in r.iter_lines(decode_unicode=True)
            if x.startswith("data: {")]


def tokenize(url, **body):
    return post(url, "/tokenize", {"model": MODEL, **body})["tokens"]


@row_check(C, "model", "prompt")
def completions_continue_the_prompt_given(server_url):
    ids = tokenize(server_url, prompt="one two three")
    r = post(server_url, "/v1/completions", {**COMPLETION, "return_token_ids": True})
    assert r["model"] == MODEL and r["choices"][0]["prompt_token_ids"] == ids
    r2 = post(server_url, "/v1/completions", {**COMPLETION, "prompt": ids,
                                              "return_token_ids": True})
    assert r2["choices"][0]["token_ids"] == r["choices"][0]["token_ids"]
    other = post(server_url, "/v1/completions", {**COMPLETION, "prompt": "zebra"})
    assert other["choices"][0]["text"] != r["choices"][0]["text"]
    bad = requests.post(server_url + "/v1/completions",
                        json={**COMPLETION, "model": "nope"}, timeout=60)
    assert bad.status_code == 404 and "nope" in bad.text


@row_check(CH, "model", "messages")
def chat_renders_the_messages_given(server_url):
    msgs = CHAT["messages"]
    ids = tokenize(server_url, messages=msgs, add_generation_prompt=True)
    r = post(server_url, "/v1/chat/completions", {**CHAT, "return_token_ids": True})
    assert r["model"] == MODEL and r["prompt_token_ids"] == ids
    bad = requests.post(server_url + "/v1/chat/completions",
                        json={**CHAT, "model": "nope"}, timeout=60)
    assert bad.status_code == 404


@row_check(C, "echo")
def completion_echo_prepends_the_prompt(server_url):
    r = post(server_url, "/v1/completions", {**COMPLETION, "echo": True})
    plain = post(server_url, "/v1/completions", COMPLETION)
    assert r["choices"][0]["text"] == "one two three" + plain["choices"][0]["text"]


@row_check(CH, "echo", "continue_final_message", "add_generation_prompt")
def chat_echo_and_continuation(server_url):
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello the"}]
    cont = dict(messages=msgs, add_generation_prompt=False,
                continue_final_message=True)
    ids = tokenize(server_url, **cont)
    with_prompt = tokenize(server_url, messages=msgs[:1], add_generation_prompt=True)
    without = tokenize(server_url, messages=msgs[:1], add_generation_prompt=False)
    assert len(with_prompt) > len(without)  # the assistant header
    r = post(server_url, "/v1/chat/completions", {**CHAT, **cont, "echo": True,
                                                  "return_token_ids": True})
    assert r["prompt_token_ids"] == ids  # the reply continues "Hello the"
    plain = post(server_url, "/v1/chat/completions", {**CHAT, **cont})
    assert r["choices"][0]["message"]["content"] == \
        "Hello the" + plain["choices"][0]["message"]["content"]


@row_check(CH, "max_completion_tokens")
def max_completion_tokens_caps_the_reply(server_url):
    r = post(server_url, "/v1/chat/completions", {**CHAT, "max_tokens": None,
                                                  "max_completion_tokens": 3})
    assert r["usage"]["completion_tokens"] == 3


@row_check(C, "add_special_tokens")
def completion_special_tokens_follow_the_field(server_url):
    # The walk's tokenizer adds a BOS (id 0) unless told not to.
    ids = {}
    for flag in (True, False):
        r = post(server_url, "/v1/completions", {
            **COMPLETION, "add_special_tokens": flag, "return_token_ids": True})
        ids[flag] = r["choices"][0]["prompt_token_ids"]
    assert ids[True] == [0] + ids[False]


@row_check(CH, "add_special_tokens", "chat_template_kwargs")
def chat_template_inputs_follow_the_fields(server_url, walk_server):
    def prompt_ids(**extra):
        return post(server_url, "/v1/chat/completions", {
            **CHAT, "max_tokens": 1, "return_token_ids": True,
            **extra})["prompt_token_ids"]
    # the template writes its own markers: no BOS unless asked for
    assert prompt_ids(add_special_tokens=True) == [0] + prompt_ids()
    greeted = prompt_ids(chat_template_kwargs={"greeting": "Howdy"})
    assert greeted != prompt_ids() and greeted == tokenize(
        server_url, messages=CHAT["messages"], add_generation_prompt=True,
        chat_template_kwargs={"greeting": "Howdy"})
    assert walk_server[1].engine.tokenizer.decode(greeted).startswith("Howdy")


@row_check(C, "stream")
@row_check(CH, "stream")
def streams_send_the_same_text_in_pieces(server_url):
    for path, body, text in (
            ("/v1/completions", COMPLETION, lambda c: c["text"]),
            ("/v1/chat/completions", CHAT,
             lambda c: c.get("delta", {}).get("content") or "")):
        whole = post(server_url, path, body)["choices"][0]
        chunks = post(server_url, path, {**body, "stream": True}, stream=True)
        pieces = [text(c) for ch in chunks for c in ch["choices"]]
        assert len([p for p in pieces if p]) > 1
        want = whole["text"] if "text" in whole else whole["message"]["content"]
        assert "".join(pieces) == want


@row_check(C, "stream_options")
@row_check(CH, "stream_options")
@row_check("stream_options", "include_usage", "continuous_usage_stats")
def stream_options_add_usage(server_url):
    for path, body in (("/v1/completions", COMPLETION),
                       ("/v1/chat/completions", CHAT)):
        plain = post(server_url, path, {**body, "stream": True}, stream=True)
        assert not any(c.get("usage") for c in plain)
        last = post(server_url, path, {**body, "stream": True, "stream_options": {
            "include_usage": True}}, stream=True)
        assert last[-1]["usage"]["completion_tokens"] == 4
        assert not any(c.get("usage") for c in last[:-1])
        every = post(server_url, path, {**body, "stream": True, "stream_options": {
            "include_usage": True, "continuous_usage_stats": True}}, stream=True)
        assert all(c.get("usage") for c in every)


@row_check(C, "priority")
@row_check(CH, "priority")
def priority_reaches_the_scheduler(server_url, walk_server):
    engine = walk_server[1].engine
    seen = []
    add = engine.add_request

    def spy(*args, priority=0, **kw):
        seen.append(priority)
        return add(*args, priority=priority, **kw)
    engine.add_request = spy
    try:
        post(server_url, "/v1/completions", {**COMPLETION, "priority": -7})
        post(server_url, "/v1/chat/completions", {**CHAT, "priority": 3})
    finally:
        del engine.add_request
    assert seen == [-7, 3]


@row_check(C, "request_id")
@row_check(CH, "request_id")
def request_ids_name_the_response(server_url):
    assert post(server_url, "/v1/completions",
                {**COMPLETION, "request_id": "abc"})["id"] == "cmpl-abc"
    assert post(server_url, "/v1/chat/completions",
                {**CHAT, "request_id": "abc"})["id"] == "chatcmpl-abc"


@row_check(C, "return_tokens_as_token_ids", "return_token_ids")
@row_check(CH, "return_tokens_as_token_ids", "return_token_ids")
def token_ids_are_returned_when_asked(server_url):
    r = post(server_url, "/v1/completions", {**COMPLETION, "logprobs": 1})
    c = r["choices"][0]
    assert c["token_ids"] is None and not c["logprobs"]["tokens"][0].startswith("token_id:")
    r = post(server_url, "/v1/completions", {**COMPLETION, "logprobs": 1,
                                             "return_token_ids": True,
                                             "return_tokens_as_token_ids": True})
    c = r["choices"][0]
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
    r = post(server_url, "/v1/chat/completions", {
        **CHAT, "logprobs": True, "return_token_ids": True,
        "return_tokens_as_token_ids": True})
    c = r["choices"][0]
    assert [e["token"] for e in c["logprobs"]["content"]] == \
        [f"token_id:{t}" for t in c["token_ids"]]
    assert post(server_url, "/v1/chat/completions", CHAT)["choices"][0]["token_ids"] is None


@row_check("tokenize_completion", "model", "prompt", "add_special_tokens",
           "return_token_strs")
def tokenize_prompt(server_url, walk_server):
    tok = walk_server[1].engine.tokenizer
    r = post(server_url, "/tokenize", {"model": MODEL, "prompt": "one two",
                                       "return_token_strs": True})
    assert r["tokens"] == tok.encode("one two") and r["count"] == len(r["tokens"])
    assert r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    plain = post(server_url, "/tokenize", {"model": MODEL, "prompt": "one two"})
    assert plain.get("token_strs") is None
    no_special = post(server_url, "/tokenize", {"model": MODEL, "prompt": "one two",
                                                "add_special_tokens": False})
    assert no_special["tokens"] == tok.encode("one two", add_special_tokens=False)
    assert r["tokens"] == [0] + no_special["tokens"]


@row_check("tokenize_chat", "model", "messages", "add_generation_prompt",
           "continue_final_message", "add_special_tokens", "chat_template_kwargs",
           "return_token_strs")
def tokenize_messages(server_url, walk_server):
    tok = walk_server[1].engine.tokenizer
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello the"}]

    def ids(**kw):
        return tokenize(server_url, messages=msgs, **kw)
    from .conftest import CHAT_TEMPLATE
    rendered = tok.apply_chat_template(msgs, tokenize=False,
                                       chat_template=CHAT_TEMPLATE,
                                       add_generation_prompt=True)
    assert ids(add_generation_prompt=True) == tok.encode(
        rendered, add_special_tokens=False)
    cont = ids(add_generation_prompt=False, continue_final_message=True)
    assert tok.decode(cont).endswith("Hello the")
    assert ids(add_generation_prompt=False) != cont
    assert ids(add_special_tokens=True) == tok.encode(rendered) == [0] + ids(
        add_generation_prompt=True)
    greeted = ids(chat_template_kwargs={"greeting": "Howdy"})
    assert tok.decode(greeted).startswith("Howdy") and greeted != ids()
    r = post(server_url, "/tokenize", {"model": MODEL, "messages": msgs,
                                       "return_token_strs": True})
    assert r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])


@row_check("detokenize", "model", "tokens")
def detokenize_gives_the_text(server_url):
    ids = tokenize(server_url, prompt="one two three", add_special_tokens=False)
    r = post(server_url, "/detokenize", {"model": MODEL, "tokens": ids})
    assert r["prompt"] == "one two three"
    r = post(server_url, "/detokenize", {"model": MODEL, "tokens": [0] + ids})
    assert r["prompt"] == "<|endoftext|>one two three"  # as vLLM: specials kept
