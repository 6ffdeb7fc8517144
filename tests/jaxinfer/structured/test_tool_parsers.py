"""Each tool-call format on canned model outputs: the whole output
(``extract``) and the same output streamed in pieces cut everywhere (one
character at a time, and at every split into two), which must give the
same content, names and arguments."""

from __future__ import annotations

import json

import pytest

from jaxinfer.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    NamedToolParser,
    RequiredToolParser,
    ToolCallStream,
    extract,
    tool_parser,
)

HERMES_TWO = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments":'
              ' {"city": "Paris", "tags": ["a}", {"b": "]\\"x"}]}}\n</tool_call>\n'
              '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
LLAMA_TWO = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": '
             '"Paris"}}; {"name": "get_time", "parameters": {"tz": "CET"}}')
MISTRAL_LIST = ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": '
                '"Paris"}}, {"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}]')
MISTRAL_ARGS = ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
                '[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}')
WEATHER = ("get_weather", {"city": "Paris"})
TIME_CET = ("get_time", {"tz": "CET"})

CASES = [
    ("hermes", HERMES_TWO, "Let me check.\n",
     [("get_weather", {"city": "Paris", "tags": ["a}", {"b": ']"x'}]}),
      ("get_time", {})]),
    ("hermes", "No tools needed <tool", "No tools needed <tool", []),
    ("hermes", "broken <tool_call>{\"name\": \"f\", \"arguments\": {]}</tool_call>",
     "broken <tool_call>{\"name\": \"f\", \"arguments\": {]}</tool_call>", []),
    ("llama3_json", LLAMA_TWO, None, [WEATHER, TIME_CET]),
    ("llama3_json", '{"name": "get_time"}', None, [("get_time", {})]),
    ("llama3_json", "Paris is sunny.", "Paris is sunny.", []),
    ("mistral", MISTRAL_LIST, None, [WEATHER, TIME_CET]),
    ("mistral", "Sure. " + MISTRAL_ARGS, "Sure. ", [WEATHER, TIME_CET]),
    ("mistral", "plain [TOOL", "plain [TOOL", []),
]


def calls_of(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def stream(parser, pieces, max_calls=None):
    """(content, [(id, name, arguments)]) from streaming ``pieces``."""
    s = ToolCallStream(parser, max_calls)
    text, content, calls = "", "", {}
    for k, piece in enumerate(pieces):
        text += piece
        new, deltas = s.update(text, final=k == len(pieces) - 1)
        content += new
        for d in deltas:
            if d.index not in calls:
                assert d.id and d.name and d.index == len(calls)
                calls[d.index] = [d.id, d.name, ""]
            else:
                assert d.id is None and d.name is None
            calls[d.index][2] += d.arguments
    return content, list(calls.values())


@pytest.mark.parametrize("name, text, content, expected", CASES)
def test_whole_output(name, text, content, expected):
    got_content, calls = extract(tool_parser(name), text)
    assert got_content == content and calls_of(calls) == expected
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("name, text, content, expected", CASES)
def test_streamed_one_character_at_a_time(name, text, content, expected):
    got, calls = stream(tool_parser(name), list(text))
    if expected:
        assert got == (content or "")
        assert [(n, json.loads(a)) for _, n, a in calls] == expected
    elif "<tool_call>" in text:
        # A call that turns out broken cannot be taken back once begun:
        # the stream sends the content before it and stops.
        assert got == text[:text.index("<tool_call>")]
    else:  # all of it content, nothing sent as a call
        assert got == text and not calls


@pytest.mark.parametrize("name, text, content, expected",
                         [c for c in CASES if c[3]])
def test_streamed_in_two_pieces_split_anywhere(name, text, content, expected):
    for cut in range(1, len(text)):
        got, calls = stream(tool_parser(name), [text[:cut], text[cut:]])
        assert got == (content or ""), cut
        assert [(n, json.loads(a)) for _, n, a in calls] == expected, cut


def test_streamed_arguments_arrive_before_the_call_ends():
    s = ToolCallStream(tool_parser("hermes"))
    _, first = s.update('<tool_call>{"name": "f", "arguments": {"q": "a')
    assert (first[0].name, first[0].arguments) == ("f", '{"q": "a')
    _, more = s.update('<tool_call>{"name": "f", "arguments": {"q": "abc"}')
    assert [(d.index, d.arguments) for d in more] == [(0, 'bc"}')]


def test_mistral_ids_are_nine_letters_or_digits():
    _, calls = extract(tool_parser("mistral"), MISTRAL_LIST)
    assert all(len(c.id) == 9 and c.id.isalnum() for c in calls)


def test_forced_formats():
    text = '[{"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {}}]'
    assert calls_of(extract(RequiredToolParser(), text)[1]) == [
        ("f", {"x": 1}), ("g", {})]
    _, calls = stream(RequiredToolParser(), list(text), max_calls=1)
    assert [(n, json.loads(a)) for _, n, a in calls] == [("f", {"x": 1})]
    _, calls = stream(NamedToolParser("f"), list('{"x": [1, 2]}'))
    assert [(n, json.loads(a)) for _, n, a in calls] == [("f", {"x": [1, 2]})]
    # Cut short (max_tokens): no call, the text is the content.
    assert extract(NamedToolParser("f"), '{"x": [1') == ('{"x": [1', [])


def test_unknown_parser_names_the_choices():
    with pytest.raises(ValueError, match="hermes"):
        tool_parser("pythonic")
    assert {"hermes", "llama3_json", "mistral"} <= set(TOOL_PARSERS)
