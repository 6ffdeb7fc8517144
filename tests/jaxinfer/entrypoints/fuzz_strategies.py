"""Hypothesis strategies for request bodies of every endpoint: valid ones,
near-valid ones (one field swapped for a hostile value, one dropped, one
unknown added) and hostile ones (wrong types, out-of-range numbers, lone
surrogates, NUL bytes, huge strings, huge lists, bodies that are not JSON)."""

from __future__ import annotations

import json

from hypothesis import strategies as st

VOCAB = 49152  # the tiny models' vocabulary (the embedded tokenizer's)

# -- hostile values ---------------------------------------------------------

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                     min_size=1, max_size=3)
any_char_text = st.text(st.characters(codec=None, categories=None,
                                      exclude_categories=[]), max_size=24)
hostile_text = st.one_of(
    any_char_text,
    st.tuples(any_char_text, surrogates).map("".join),
    st.just("\x00" * 16), st.just("<|im_start|>system\n" * 40),
    st.just("x" * 300_000), st.just("word " * 5_000))
hostile_number = st.one_of(
    st.integers(-2 ** 80, 2 ** 80), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-1, 0, 2 ** 31, 2 ** 63, 2 ** 64, 1e39, 1e308, -1e308,
                     5e-324, VOCAB, VOCAB - 1, 0.5]))
hostile_scalar = st.one_of(st.none(), st.booleans(), hostile_number, hostile_text)
hostile_value = st.one_of(
    st.recursive(hostile_scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(any_char_text, surrogates), inner, max_size=4)),
        max_leaves=8),
    st.just(list(range(100_000))), st.just([0.5] * 1_000), st.just(["a"] * 1_000),
    st.just({str(i): 1e308 for i in range(2_000)}))

# -- valid values -------------------------------------------------------------

valid_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]),
                     max_size=30)
token_ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)
model = st.sampled_from(["tiny", "tiny", "other-model"])


def endpoints(text):
    """{path: (required fields, optional fields)}, every string drawn from
    ``text``: valid text gives valid bodies, hostile text poisoned ones."""
    nonempty = text.filter(bool)
    # max_tokens is required: without it a chat runs to the context's end,
    # and short generations keep 2,000 requests within the time budget.
    short = {"max_tokens": st.integers(1, 4)}
    sampling = {
        "model": model,
        "temperature": st.one_of(st.just(0.0), st.floats(0.0, 2.0)),
        "top_p": st.floats(0.05, 1.0), "top_k": st.integers(-1, 60),
        "min_p": st.floats(0.0, 1.0), "n": st.integers(1, 2),
        "seed": st.integers(-2 ** 63, 2 ** 63 - 1),
        "stop": st.one_of(text, st.lists(text, max_size=3)),
        "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=3),
        "bad_words": st.lists(text, max_size=3),
        "logit_bias": st.dictionaries(st.integers(0, VOCAB - 1).map(str),
                                      st.floats(-150, 150), max_size=3),
        "allowed_token_ids": st.lists(st.integers(0, VOCAB - 1), min_size=1,
                                      max_size=4),
        "min_tokens": st.integers(0, 2), "ignore_eos": st.booleans(),
        "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.5, 2.0),
        "include_stop_str_in_output": st.booleans(),
        "skip_special_tokens": st.booleans(), "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    }
    messages = st.lists(st.fixed_dictionaries({
        "role": st.one_of(st.sampled_from(["system", "user", "assistant"]), text),
        "content": st.one_of(text, st.lists(st.fixed_dictionaries(
            {"type": st.just("text"), "text": text}), min_size=1, max_size=2))}),
        min_size=1, max_size=3)
    return {
        "/v1/completions": ({**short, "prompt": st.one_of(
            nonempty, token_ids, st.lists(nonempty, min_size=1, max_size=2),
            st.lists(token_ids, min_size=1, max_size=2))}, {
            **sampling, "logprobs": st.integers(0, 3), "echo": st.booleans(),
            "add_special_tokens": st.booleans()}),
        "/v1/chat/completions": ({**short, "messages": messages}, {
            **sampling, "max_completion_tokens": st.integers(1, 4),
            "logprobs": st.booleans(), "top_logprobs": st.integers(0, 3),
            "add_generation_prompt": st.booleans(),
            "continue_final_message": st.booleans(),
            "chat_template_kwargs": st.dictionaries(text, text, max_size=2),
            "response_format": st.just({"type": "text"})}),
        "/tokenize": ({}, {"prompt": text, "messages": messages, "model": model,
                           "add_special_tokens": st.booleans(),
                           "add_generation_prompt": st.booleans()}),
        "/detokenize": ({"tokens": st.lists(st.integers(0, VOCAB - 1), max_size=20)},
                        {"model": model}),
        "/generate": ({**short, "prompt": st.one_of(
            nonempty, token_ids,
            st.fixed_dictionaries({"prompt_token_ids": token_ids}),
            st.fixed_dictionaries({"prompt": nonempty}))},
            {k: v for k, v in sampling.items()
             if k not in ("model", "stream_options")}),
    }


ENDPOINTS = endpoints(valid_text)
POISONED = endpoints(st.one_of(valid_text, hostile_text))
TEXT_FIELDS = {"prompt", "messages", "stop", "bad_words", "chat_template_kwargs"}
# Every string of a field carries a lone surrogate (or a NUL byte): the
# values that used to reach the tokenizer on the engine thread.
BROKEN_TEXT = endpoints(st.tuples(
    valid_text, st.one_of(surrogates, surrogates, surrogates, st.just("\x00")),
    valid_text).map("".join))


def request_bodies(path: str):
    """(body bytes, content type) for ``path``: valid, near-valid, hostile."""
    required, optional = ENDPOINTS[path]
    valid = st.fixed_dictionaries(required, optional=optional)
    poisoned_required, poisoned_optional = POISONED[path]
    poisoned = st.fixed_dictionaries(poisoned_required, optional=poisoned_optional)
    names = sorted(set(required) | set(optional)) + ["unknown_field"]
    swapped = st.tuples(valid, st.sampled_from(names), hostile_value).map(
        lambda t: {**t[0], t[1]: t[2]})
    broken_required, broken_optional = BROKEN_TEXT[path]
    broken = {k: v for k, v in {**broken_required, **broken_optional}.items()
              if k in TEXT_FIELDS}
    one_broken_field = st.tuples(valid, st.sampled_from(sorted(broken))).flatmap(
        lambda t: broken[t[1]].map(lambda value: {**t[0], t[1]: value})
    ) if broken else valid  # /detokenize takes no text
    dropped = valid.flatmap(lambda body: st.sampled_from(sorted(body) or [""]).map(
        lambda name: {k: v for k, v in body.items() if k != name}))
    as_json = st.one_of(valid, valid, swapped, poisoned, one_broken_field,
                        one_broken_field, dropped, hostile_value).map(
        lambda body: (json.dumps(body, allow_nan=True).encode(), "application/json"))
    raw = st.tuples(st.one_of(st.binary(max_size=64),
                              st.just(b'{"prompt": "unterminated'),
                              st.just(b"\xff\xfe{}"), st.just(b"[" * 5_000)),
                    st.sampled_from(["application/json", "text/plain"]))
    return st.one_of(as_json, as_json, as_json, raw)
