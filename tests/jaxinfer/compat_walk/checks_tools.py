"""Behaviour checks of the tool-calling rows: calls forced by tool_choice
through the grammar on the walk's server (no parser), "auto" read by the
Hermes parser on the CLI server (--enable-auto-tool-choice,
--tool-call-parser), tools shown to the template unless
--exclude-tools-when-tool-choice-none hides them."""

from __future__ import annotations

import json

import requests

from .checks_serve import HEADERS
from .registry import row_check
from .surfaces import MODEL

PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"k": {"enum": [1, 2]}},
    "required": ["k"], "additionalProperties": False}}}
OTHER = {"type": "function", "function": {"name": "other"}}
ASK = [{"role": "user", "content": "one two three"}]


def chat(url, headers=None, **body):
    return requests.post(url + "/v1/chat/completions", headers=headers,
                         timeout=300, json={"model": MODEL, "messages": ASK,
                                            "temperature": 0, "max_tokens": 80,
                                            **body})


@row_check("chat_completion_request", "tools", "tool_choice",
           "parallel_tool_calls")
def tool_choice_forces_calls(server_url):
    free = chat(server_url).json()["choices"][0]
    assert not free["message"]["tool_calls"]
    named = chat(server_url, tools=[PICK, OTHER], tool_choice={
        "type": "function", "function": {"name": "pick"}}).json()["choices"][0]
    [call] = named["message"]["tool_calls"]
    assert named["finish_reason"] == "tool_calls" and call["function"]["name"] == "pick"
    assert json.loads(call["function"]["arguments"]) in ({"k": 1}, {"k": 2})
    one = chat(server_url, tools=[PICK, OTHER], tool_choice="required",
               parallel_tool_calls=False).json()["choices"][0]
    assert len(one["message"]["tool_calls"]) == 1
    assert one["message"]["tool_calls"][0]["function"]["name"] in ("pick", "other")
    auto = chat(server_url, tools=[PICK])
    assert auto.status_code == 400 and "--tool-call-parser" in auto.text
    none = chat(server_url, tools=[PICK], tool_choice="none").json()
    assert not none["choices"][0]["message"]["tool_calls"]


@row_check("tokenize_chat", "tools")
def tokenize_shows_the_tools_to_the_template(server_url):
    def count(**kw):
        return requests.post(server_url + "/tokenize", timeout=60, json={
            "model": MODEL, "messages": ASK, **kw}).json()["count"]
    assert count(tools=[PICK]) > count()


@row_check("serve_flags", "enable_auto_tool_choice", "tool_call_parser",
           "exclude_tools_when_tool_choice_none")
def serve_reads_auto_tool_calls(cli_server):
    url, _ = cli_server
    regex = r'<tool_call>\{"name": "pick", "arguments": \{"k": [12]\}\}</tool_call>'
    body = dict(model="first", tools=[PICK], max_tokens=30)
    r0 = chat(url, HEADERS, guided_regex=regex, **body)
    assert r0.status_code == 200, r0.text
    auto = r0.json()["choices"][0]
    [call] = auto["message"]["tool_calls"]
    assert auto["finish_reason"] == "tool_calls" and call["function"]["name"] == "pick"
    # The template shows tools ("TOOLS"), except under tool_choice "none".
    shown = chat(url, HEADERS, tool_choice="required", **body).json()
    hidden = chat(url, HEADERS, tool_choice="none", **body).json()
    plain = chat(url, HEADERS, model="first", max_tokens=30).json()
    assert shown["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    assert hidden["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
