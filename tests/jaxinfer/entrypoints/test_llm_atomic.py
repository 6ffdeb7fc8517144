"""`LLM.generate` is atomic: a bad prompt anywhere in the
batch raises before anything is queued, so nothing runs inside the next call,
and every value the HTTP edge refuses is refused here too."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.errors import InvalidRequestError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    return LLM(tiny_model_factory(), max_model_len=64, num_gpu_blocks_override=64,
               max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def reference(llm):
    return llm.generate(["Hello"], GREEDY, use_tqdm=False)[0]


@pytest.mark.parametrize("third, params, needle", [
    ("fine", [GREEDY, GREEDY, SamplingParams(max_tokens=2, bad_words=["\ud800"])],
     "bad_words"),
    ({"prompt_token_ids": [1.5, 2.0]}, GREEDY, "integer token ids"),
    ({"prompt_token_ids": ["a"]}, GREEDY, "integer token ids"),
    (["a", "b"], GREEDY, "integer token ids"),
    ([True, 2], GREEDY, "integer token ids"),
    ({"prompt_token_ids": [10 ** 9]}, GREEDY, "vocabulary"),
    ("x\ud800", GREEDY, "Unicode"),
    ({"text": "hi"}, GREEDY, "prompt dict"),
    (3.5, GREEDY, "a prompt must be"),
])
def test_a_bad_third_prompt_queues_nothing(llm, reference, third, params, needle):
    engine = llm.llm_engine
    with pytest.raises(InvalidRequestError, match=needle):
        llm.generate(["Hello", "World", third], params, use_tqdm=False)
    assert not engine.has_unfinished_requests()
    assert not engine.scheduler.requests
    out = llm.generate(["Hello"], GREEDY, use_tqdm=False)
    assert len(out) == 1
    assert out[0].outputs[0].token_ids == reference.outputs[0].token_ids
    pool = engine.scheduler.kv.pool
    assert pool.num_free == pool.num_blocks - 1


def test_engine_add_request_refuses_what_the_server_refuses(llm):
    engine = llm.llm_engine
    for params, needle in [
            (SamplingParams(n=5, temperature=1.0), "max_num_seqs"),
            (SamplingParams(stop=["ok", "\udfff"]), "stop"),
    ]:
        with pytest.raises(InvalidRequestError, match=needle):
            engine.add_request(None, "Hello", params)
    engine.add_request("dup", "Hello", GREEDY)
    with pytest.raises(InvalidRequestError, match="already in flight"):
        engine.add_request("dup", "Hello", GREEDY)
    engine.abort_request(["dup"])
    assert not engine.has_unfinished_requests()


def test_an_error_during_the_run_leaves_nothing_queued(llm, reference, monkeypatch):
    engine = llm.llm_engine
    real_step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C in a notebook
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Hello", "World"], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
    out = llm.generate(["Hello"], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [reference.outputs[0].token_ids]
