"""Behaviour checks of the sampling fields, written once against a
``Surface`` and registered for the SamplingParams table and both request
bodies: each runs through the offline LLM, /v1/completions and
/v1/chat/completions. Each compares against a run without the field, or
asserts the field's effect directly, so a field that is dropped anywhere
on the way to the sampler fails."""

from __future__ import annotations

import contextlib

from .registry import row_check

PROMPT = "one two three four"
HOT = 5.0  # a temperature at which seeds and filters visibly matter
BODIES = ("completion_request", "chat_completion_request")
ALL = ("sampling_params",) + BODIES


def on(tables, *rows):
    """row_check for several tables at once."""
    def register(fn):
        for table in tables:
            row_check(table, *rows)(fn)
        return fn
    return register


def greedy(surface, **fields):
    fields = {"temperature": 0, "max_tokens": 8, "ignore_eos": True, **fields}
    return surface.run(PROMPT, **fields)[0]


def hot(surface, seed, **fields):
    fields = {"temperature": HOT, "seed": seed, "max_tokens": 8,
              "ignore_eos": True, **fields}
    return surface.run(PROMPT, **fields)[0]


@row_check("chat_completion_request", "top_logprobs")  # chat's top-k
@on(ALL, "temperature", "seed", "logprobs")
def greedy_is_argmax_and_seeds_reproduce(surface):
    g = greedy(surface, logprobs=3)
    assert len(g.logprobs) == len(g.token_ids) == 8
    for tok, cands in zip(g.token_ids, g.logprobs):
        # top-3 plus the sampled token; at temperature 0 it is the top one
        assert 3 <= len(cands) <= 4 and all(v <= 0 for v in cands.values())
        assert cands[tok] == max(cands.values())
    assert greedy(surface).logprobs is None  # only when asked for
    a, b, c = hot(surface, 1), hot(surface, 1), hot(surface, 2)
    assert a.token_ids == b.token_ids  # a seed reproduces
    assert a.token_ids != c.token_ids  # another seed differs
    assert a.token_ids != g.token_ids  # the temperature is used


@on(ALL, "top_k", "top_p", "min_p")
def filters_that_keep_one_token_are_greedy(surface):
    g = greedy(surface).token_ids
    assert hot(surface, 3).token_ids != g  # without a filter: not greedy
    assert hot(surface, 3, top_k=1).token_ids == g
    assert hot(surface, 3, top_p=1e-6).token_ids == g
    assert hot(surface, 3, min_p=1.0).token_ids == g


@on(ALL, "n")
def n_draws_several_samples(surface):
    samples = surface.run(PROMPT, n=3, temperature=HOT, seed=4, max_tokens=6,
                          ignore_eos=True)
    assert len(samples) == 3
    assert len({tuple(s.token_ids) for s in samples}) > 1


@on(ALL, "best_of")
def best_of_returns_the_likeliest_of_its_draws(surface):
    # best_of draws its samples as n does (the same seeds), then keeps the
    # one with the highest cumulative logprob.
    fields = dict(temperature=HOT, seed=5, max_tokens=6, ignore_eos=True,
                  logprobs=0)
    drawn = surface.run(PROMPT, n=4, **fields)
    best = surface.run(PROMPT, n=1, best_of=4, **fields)
    assert len(best) == 1

    def score(s):
        return sum(lp[t] for t, lp in zip(s.token_ids, s.logprobs))
    assert len({tuple(s.token_ids) for s in drawn}) > 1
    assert abs(score(best[0]) - max(map(score, drawn))) < 1e-4


@on(ALL, "max_tokens", "ignore_eos", "min_tokens", "logit_bias",
    "stop_token_ids")
def lengths_and_stops_follow_the_fields(surface):
    eos = 2  # the tiny models' EOS (<|im_end|>)
    forced = {eos: 100.0}  # EOS comes first unless something stops it
    s = surface.run(PROMPT, temperature=0, max_tokens=6, logit_bias=forced)[0]
    assert (s.token_ids, s.finish_reason) == ([eos], "stop")
    s = surface.run(PROMPT, temperature=0, max_tokens=6, logit_bias=forced,
                    ignore_eos=True)[0]
    assert (s.token_ids, s.finish_reason) == ([eos] * 6, "length")
    s = surface.run(PROMPT, temperature=0, max_tokens=6, logit_bias=forced,
                    min_tokens=3)[0]
    assert len(s.token_ids) == 4 and s.token_ids[3] == eos
    assert eos not in s.token_ids[:3] and s.finish_reason == "stop"
    g = greedy(surface)
    assert len(g.token_ids) == 8 and g.finish_reason == "length"
    stop_id = g.token_ids[2]
    s = greedy(surface, stop_token_ids=[stop_id])
    assert s.token_ids == g.token_ids[:g.token_ids.index(stop_id) + 1]
    assert s.finish_reason == "stop"


@on(ALL, "allowed_token_ids")
def allowed_token_ids_bound_every_token(surface):
    allowed = [100, 200, 300]
    s = hot(surface, 6, allowed_token_ids=allowed)
    assert set(s.token_ids) <= set(allowed)
    assert not set(hot(surface, 6).token_ids) <= set(allowed)


@on(ALL, "stop", "include_stop_str_in_output")
def stop_strings_end_the_text(surface):
    g = greedy(surface)
    text = g.text
    # A stop string from the middle of the greedy text, first seen there.
    k = next(k for k in range(len(text) // 3, len(text) - 2)
             if text.find(text[k:k + 2]) == k and text[k:k + 2].strip())
    stop = text[k:k + 2]
    s = greedy(surface, stop=[stop])
    assert (s.text, s.finish_reason) == (text[:k], "stop")
    s = greedy(surface, stop=[stop], include_stop_str_in_output=True)
    assert s.text == text[:k + 2]


# vLLM's completion body has no bad_words (jaxinfer's accepts it as well).
@on(("sampling_params", "chat_completion_request"), "bad_words")
def bad_words_are_never_generated(surface):
    tok = surface.tokenizer

    def ids(text):
        return tok.encode(text, add_special_tokens=False)
    g = greedy(surface)
    # A generated token that is a whole word alone or, where the word is
    # one token, with a leading space: banning the word bans that token.
    word, banned = next(
        (w, t) for t in g.token_ids
        if (w := tok.decode([t]).strip()).isalpha()
        and (ids(w) == [t] or (len(ids(w)) == 1 and ids(" " + w) == [t])))
    s = greedy(surface, bad_words=[word])
    assert banned not in s.token_ids and s.token_ids != g.token_ids


@on(ALL, "presence_penalty", "frequency_penalty", "repetition_penalty")
def penalties_change_repeating_output(surface):
    # Four allowed tokens (the likeliest at the first position): without
    # penalties greedy repeats them; each penalty pushes the seen ones down.
    first = greedy(surface, logprobs=4).logprobs[0]
    allowed = sorted(first, key=first.get, reverse=True)[:4]
    base = greedy(surface, allowed_token_ids=allowed, max_tokens=10).token_ids
    assert len(set(base)) < len(base) - 3, base  # it repeats
    for field, value in (("presence_penalty", 2.0),
                         ("frequency_penalty", 2.0),
                         ("repetition_penalty", 3.0)):
        s = greedy(surface, allowed_token_ids=allowed, max_tokens=10,
                   **{field: value}).token_ids
        assert s != base, (field, base, s)


@on(ALL, "prompt_logprobs")
def prompt_logprobs_cover_the_prompt(surface):
    s = greedy(surface, prompt_logprobs=2, max_tokens=1)
    assert len(s.prompt_logprobs) == len(s.prompt_token_ids)
    assert s.prompt_logprobs[0] is None
    for tok, cands in zip(s.prompt_token_ids[1:], s.prompt_logprobs[1:]):
        assert tok in cands and 2 <= len(cands) <= 3
    assert greedy(surface, max_tokens=1).prompt_logprobs is None


@on(ALL, "truncate_prompt_tokens")
def truncate_prompt_tokens_keeps_the_last(surface):
    full = greedy(surface, max_tokens=1).prompt_token_ids
    assert len(full) > 3
    s = greedy(surface, max_tokens=1, truncate_prompt_tokens=3)
    assert s.prompt_token_ids == full[-3:]


@on(ALL, "skip_special_tokens")
def special_tokens_are_skipped_unless_asked(surface):
    im_start = 1  # <|im_start|>, a special token of the tiny tokenizer
    fields = dict(logit_bias={im_start: 100.0}, max_tokens=3)
    assert "<|im_start|>" not in greedy(surface, **fields).text
    kept = greedy(surface, skip_special_tokens=False, **fields)
    assert kept.text == "<|im_start|>" * 3


@contextlib.contextmanager
def eos_is(engine, token: int):
    """The engine treats ``token`` as EOS (for new requests) meanwhile."""
    saved = engine.eos_token_ids
    engine.eos_token_ids = (token,)
    try:
        yield
    finally:
        engine.eos_token_ids = saved


# (vLLM's SamplingParams has no use_beam_search: LLM.beam_search instead)
@on(BODIES, "use_beam_search", "length_penalty")
def beam_search_ranks_by_length_penalized_score(surface):
    g = greedy(surface, logprobs=0)
    beams = surface.run(PROMPT, use_beam_search=True, n=2, temperature=0,
                        max_tokens=4, ignore_eos=True, logprobs=0)
    assert len(beams) == 2 and beams[0].token_ids != beams[1].token_ids

    def score(s):
        return sum(lp[t] for t, lp in zip(s.token_ids, s.logprobs))
    assert score(beams[0]) >= score(beams[1])
    # With the first greedy token as EOS, one beam ends at once. Without a
    # length penalty its (higher) raw score wins; a large penalty favours
    # the longer beams.
    with eos_is(surface.engine, g.token_ids[0]):
        short = surface.run(PROMPT, use_beam_search=True, n=2, temperature=0,
                            max_tokens=4, length_penalty=0.0)
        long = surface.run(PROMPT, use_beam_search=True, n=2, temperature=0,
                           max_tokens=4, length_penalty=20.0)
    assert short[0].token_ids == [g.token_ids[0]]
    assert len(long[0].token_ids) == 4


@contextlib.contextmanager
def params_seen(engine):
    """The SamplingParams of each request the engine is given meanwhile."""
    seen = []
    add = engine.add_request

    def spy(request_id, prompt, params=None, *args, **kw):
        seen.append(getattr(prompt, "params", None) or params)
        return add(request_id, prompt, params, *args, **kw)
    engine.add_request = spy
    try:
        yield seen
    finally:
        del engine.add_request


def wordpiece_tokenizer():
    """A tokenizer whose decoder puts a space before every token (BERT's
    WordPiece), with one special token, [X] = 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.WordLevel({"[UNK]": 0, "[X]": 1, "hello": 2,
                                    "world": 3}, unk_token="[UNK]"))
    t.pre_tokenizer, t.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]",
                                   additional_special_tokens=["[X]"])


@on(ALL, "spaces_between_special_tokens")
def no_spaces_between_special_tokens_when_asked(surface):
    # The tiny tokenizer's decoder adds no spaces, so the text is the same
    # either way (as in vLLM's fast detokenizer); the field must reach the
    # engine, whose detokenizer drops the spaces of a decoder that adds them.
    from jaxinfer import SamplingParams
    from jaxinfer.engine.detokenizer import IncrementalDetokenizer
    with params_seen(surface.engine) as seen:
        greedy(surface, max_tokens=2, skip_special_tokens=False,
               spaces_between_special_tokens=False)
    assert [p.spaces_between_special_tokens for p in seen] == [False]
    texts = {}
    for spaces in (True, False):
        detok = IncrementalDetokenizer(wordpiece_tokenizer(), [2], SamplingParams(
            skip_special_tokens=False, spaces_between_special_tokens=spaces))
        for tok in (3, 1, 1):
            detok.step(tok)
        texts[spaces] = detok.text
    assert texts == {True: " world [X] [X]", False: " world [X][X]"}


@row_check("sampling_params", "detokenize")
def detokenize_false_gives_ids_only(surface):
    g = greedy(surface)
    s = greedy(surface, detokenize=False)
    assert s.token_ids == g.token_ids and g.text and s.text == ""


@row_check("sampling_params", "output_kind")
def output_kinds_stream_as_asked(llm):
    from jaxinfer import SamplingParams
    from jaxinfer.sampling_params import RequestOutputKind as K
    engine = llm.llm_engine

    def outputs(kind):
        engine.add_request(f"kind-{kind.name}", PROMPT, SamplingParams(
            temperature=0, max_tokens=5, ignore_eos=True, output_kind=kind))
        got = []
        while engine.has_unfinished_requests():
            got += [o.outputs[0].token_ids for o in engine.step()]
        return got
    whole = outputs(K.CUMULATIVE)
    assert len(whole) == 5 and [len(t) for t in whole] == [1, 2, 3, 4, 5]
    deltas = outputs(K.DELTA)
    assert [len(t) for t in deltas] == [1] * 5
    assert sum(deltas, []) == whole[-1]
    assert outputs(K.FINAL_ONLY) == [whole[-1]]
