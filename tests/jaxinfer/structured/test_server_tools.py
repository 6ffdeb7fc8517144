"""Tool calling through the server's app with the official openai client,
on the embedded model with the Hermes parser and a chat template that
renders tools: tool_choice required / named (forced by the grammar, so the
calls are valid whatever the model), auto (the Hermes format forced by a
regex, then read by the parser), none, streaming deltas, parallel calls,
a conversation carrying calls and their results, and the 400s."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.jaxinfer.entrypoints.conftest import ServerThread, openai_client

from .conftest import EMBEDDED

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 16},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {
    "timezone": {"enum": ["UTC", "CET", "JST"]}},
    "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a timezone",
        "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# A Hermes-style template (as Qwen's) that shows the tools and renders an
# assistant's calls from their decoded arguments.
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nFunctions you may call, as "
    "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>:\n"
    "{% for t in tools %}{{ t.function | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": "
    "\"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments.items()"
    " | list | tojson }}}</tool_call>{% endfor %}{% else %}{{ m.content }}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def server(xla_cache):
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.openai.api_server import build_app
    from jaxinfer.entrypoints.openai.serving_tools import ToolConfig
    engine = AsyncLLMEngine.from_engine_args(EngineArgs(
        model=EMBEDDED, max_model_len=512, max_num_seqs=8,
        max_num_batched_tokens=256, compilation_cache_dir=xla_cache))
    server = ServerThread(build_app(
        engine, [EMBEDDED], chat_template=TEMPLATE,
        tool_config=ToolConfig(enable_auto_tool_choice=True,
                               tool_call_parser="hermes")))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _chat(client, **kw):
    body = dict(model=EMBEDDED, messages=ASK, tools=TOOLS, temperature=0,
                max_tokens=120)
    return client.chat.completions.create(**{**body, **kw})


def _check_calls(calls, names=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments),
                            SCHEMAS[c.function.name])


def _streamed(client, **kw):
    """(content, calls as {index: [id, name, arguments]}, finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in _chat(client, stream=True, **kw):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                if d.index not in calls:  # the first delta names the call
                    assert d.id and d.type == "function" and d.function.name
                    calls[d.index] = [d.id, d.function.name, ""]
                else:
                    assert d.id is None and d.function.name is None
                calls[d.index][2] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish


def test_required_gives_valid_calls(client):
    r = _chat(client, tool_choice="required", parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls)


def test_named_function_is_called(client):
    r = _chat(client, tool_choice={"type": "function",
                                   "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    _check_calls(calls, {"get_time"})


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_calls_match_the_whole_response(client, tool_choice):
    kw = dict(tool_choice=tool_choice, parallel_tool_calls=False)
    whole = _chat(client, **kw).choices[0].message.tool_calls
    content, calls, finish = _streamed(client, **kw)
    assert finish == "tool_calls" and content == ""
    assert [(name, json.loads(args)) for _, name, args in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole]


def test_parallel_calls_are_valid_or_cut_short(client):
    """Parallel calls may repeat until max_tokens on a small model: then
    the text is content and no half-made call is returned."""
    r = _chat(client, tool_choice="required", max_tokens=200,
              messages=[{"role": "user", "content": "Weather in Paris, Rome "
                         "and Tokyo, and the time in each."}])
    choice = r.choices[0]
    if choice.finish_reason == "length":
        assert not choice.message.tool_calls and choice.message.content
    else:
        assert choice.finish_reason == "tool_calls"
        _check_calls(choice.message.tool_calls)


# Forces the Hermes format, so that "auto" finds a call to read.
HERMES_CALL = (r'<tool_call>\n\{"name": "get_weather", "arguments": '
               r'\{"city": "[A-Z][a-z]{2,8}", "unit": "celsius"\}\}\n</tool_call>')


def test_auto_reads_the_parsers_format(client):
    r = _chat(client, extra_body={"guided_regex": HERMES_CALL})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls(choice.message.tool_calls, {"get_weather"})
    content, calls, finish = _streamed(
        client, extra_body={"guided_regex": HERMES_CALL})
    assert finish == "tool_calls" and content == ""
    [(_, name, args)] = calls.values()
    assert (name, json.loads(args)) == (
        "get_weather", json.loads(choice.message.tool_calls[0].function.arguments))


def test_auto_and_none_without_a_call_give_content(client):
    for kw in ({}, {"tool_choice": "none"}):
        r = _chat(client, max_tokens=8,
                  messages=[{"role": "user", "content": "Say hello."}], **kw)
        choice = r.choices[0]
        assert choice.message.content and not choice.message.tool_calls
        assert choice.finish_reason in ("stop", "length")
    content, calls, _ = _streamed(client, max_tokens=8, messages=[
        {"role": "user", "content": "Say hello."}])
    assert content and not calls


def test_tools_reach_the_template(server):
    import requests
    body = {"model": EMBEDDED, "messages": ASK}
    plain = requests.post(server.base_url + "/tokenize", json=body, timeout=60)
    with_tools = requests.post(server.base_url + "/tokenize",
                               json={**body, "tools": TOOLS}, timeout=60)
    assert with_tools.json()["count"] > plain.json()["count"] + 20


def test_conversation_with_calls_and_results(client):
    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1",
                       "content": '{"temperature": 21}'}]
    r = _chat(client, messages=messages, tool_choice="none", max_tokens=10)
    assert r.choices[0].message.content


@pytest.mark.parametrize("kw, match", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'nope', which is not in tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}},
     "constrains the output itself"),
    ({"messages": ASK + [{"role": "tool", "content": "21"}]}, "tool_call_id"),
    ({"tools": None, "tool_choice": "required"}, "needs tools"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function",
         "function": {"name": "get_time", "arguments": "{oops"}}]}]},
     "arguments is not JSON"),
])
def test_bad_requests_are_400s_that_say_why(client, kw, match):
    if kw.get("tools", TOOLS) is None:
        kw = {**kw, "tools": openai.NOT_GIVEN}
    with pytest.raises(openai.BadRequestError, match=match):
        _chat(client, **kw)
