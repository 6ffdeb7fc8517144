"""`LLM.generate` / `chat` on a tiny model: input forms, per-prompt params,
stops (tokens, strings, min_tokens), finish/stop reasons, metrics, priority,
and incremental detokenization of multi-byte UTF-8."""

from __future__ import annotations

import pytest

from jaxinfer import SamplingParams
from jaxinfer.engine.detokenizer import IncrementalDetokenizer

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm()


def _gen(llm, prompt, **kw):
    return llm.generate(prompt, SamplingParams(**GREEDY, **kw), use_tqdm=False)[0]


def test_input_forms_agree(llm):
    tok = llm.get_tokenizer()
    text = "The quick brown fox"
    ids = tok.encode(text)
    outs = llm.generate([text, ids, {"prompt": text}, {"prompt_token_ids": ids}],
                        SamplingParams(**GREEDY, max_tokens=5), use_tqdm=False)
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1
    assert outs[0].prompt == text and outs[1].prompt is None
    assert all(o.prompt_token_ids == ids for o in outs)
    single = llm.generate(text, SamplingParams(**GREEDY, max_tokens=5),
                          use_tqdm=True)
    assert single[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_one_sampling_params_per_prompt(llm):
    outs = llm.generate(["a b", "c d", "e f"],
                        [SamplingParams(**GREEDY, max_tokens=n, ignore_eos=True)
                         for n in (1, 3, 6)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 3, 6]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams()] * 2, use_tqdm=False)


def test_metrics_are_ordered(llm):
    out = _gen(llm, "timing", max_tokens=4, ignore_eos=True)
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time
    assert m.first_token_time <= m.last_token_time <= m.finished_time
    assert out.finished and out.outputs[0].finish_reason == "length"


def test_stop_token_ids(llm):
    base = _gen(llm, "stop here", max_tokens=8, ignore_eos=True).outputs[0]
    target = base.token_ids[2]
    first = base.token_ids.index(target)
    out = _gen(llm, "stop here", max_tokens=8, ignore_eos=True,
               stop_token_ids=[target]).outputs[0]
    assert out.token_ids == base.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == target


def test_stop_strings_and_include(llm):
    base = _gen(llm, "Once upon a time", max_tokens=12, ignore_eos=True).outputs[0]
    text = base.text
    assert len(text) > 8, text
    stop = text[4:7]
    idx = text.find(stop)
    out = _gen(llm, "Once upon a time", max_tokens=12, ignore_eos=True,
               stop=[stop]).outputs[0]
    assert out.text == text[:idx]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    inc = _gen(llm, "Once upon a time", max_tokens=12, ignore_eos=True,
               stop=[stop], include_stop_str_in_output=True).outputs[0]
    assert inc.text == text[:idx + len(stop)]
    # min_tokens: stop strings count only once min_tokens tokens exist.
    late = _gen(llm, "Once upon a time", max_tokens=12, ignore_eos=True,
                stop=[stop], min_tokens=10).outputs[0]
    assert len(late.token_ids) >= 10


def test_chat(llm):
    out = llm.chat([{"role": "user", "content": "hi"}],
                   SamplingParams(**GREEDY, max_tokens=3), use_tqdm=False)
    assert len(out) == 1 and out[0].finished
    assert len(out[0].outputs[0].token_ids) <= 3


def test_priority_policy_orders_admission(make_llm):
    llm = make_llm(scheduling_policy="priority")
    engine = llm.llm_engine
    sp = SamplingParams(**GREEDY, max_tokens=2)
    # Each 30-token prompt fills the 32-token budget: one admission per step.
    for rid, prio in (("low", 5), ("mid", 1), ("high", -3)):
        engine.add_request(rid, {"prompt_token_ids": [11] * 30}, sp,
                           priority=prio)
    started = {}
    while engine.has_unfinished_requests():
        engine.step()
        for r in engine.scheduler.running:
            started.setdefault(r.request_id, len(started))
    assert sorted(started, key=started.get) == ["high", "mid", "low"]


@pytest.mark.parametrize("text", ["héllo wörld", "你好，世界", "emoji 🙂👍🏽 ok",
                                  "mixed ü 中文 🚀 end"])
def test_incremental_detokenization_multibyte(llm, text):
    tok = llm.get_tokenizer()
    prompt = tok.encode("Say:")
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams())
    pieces = []
    for t in ids:
        before = detok.text
        detok.step(t)
        pieces.append(detok.text[len(before):])
    assert all("\ufffd" not in p for p in pieces), pieces
    assert "".join(pieces) == tok.decode(ids) == detok.text
    # Byte-level BPE splits wide characters over tokens: those emit nothing
    # until the character is whole (never a replacement character).
    assert any(p == "" for p in pieces) or all(ord(c) < 0x800 for c in text)
