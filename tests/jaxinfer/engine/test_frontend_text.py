"""The split server's text: an `EngineCore` sends token ids only (through
the message codec), `FrontendText` makes the text, and the result is what
`LLM.generate` gives for the same requests (text, token ids, finish and
stop reasons, logprobs and their decoded tokens, prompt logprobs, n > 1);
a stop string found in the front end frees the request in the core."""

from __future__ import annotations

import dataclasses

import pytest

from jaxinfer import SamplingParams
from jaxinfer.engine.core import EngineCore
from jaxinfer.engine.core_messages import AddRequest, Codec, CoreOutputs, StopSamples
from jaxinfer.engine.frontend_text import FrontendText
from jaxinfer.metrics import EngineMetrics
from jaxinfer.outputs import CompletionOutput
from jaxinfer.sampling_params import RequestOutputKind
from tests.stop_strings import stop_inside_one_token, stop_spanning_tokens, token_text_ends

PROMPT = "The quick brown fox"
FRONT = b"front-0"


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm()


@pytest.fixture(scope="module")
def reference(llm):
    """Greedy text with no stop, and where each token's text ends."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    return out.outputs[0].text, token_text_ends(
        llm.llm_engine.tokenizer, out.prompt_token_ids, out.outputs[0].token_ids)


def found(stop: str | None) -> str:
    if stop is None:
        pytest.skip("the reference text has no such stop string")
    return stop


def split_generate(llm, params: SamplingParams, prompt=PROMPT):
    """One request through an engine core and a front end's text, as the
    multi-process server runs it; the client's outputs merged into the
    final one, and whether the core freed everything."""
    engine = llm.llm_engine
    core = EngineCore(engine, max_num_waiting=None, metrics=EngineMetrics())
    codec, text = Codec(), FrontendText(engine.tokenizer)
    processed = engine.input_processor.process(prompt, params)
    params = processed.params.clone()
    params.output_kind = RequestOutputKind.DELTA
    rid = "req-1"
    core_params = text.add(rid, processed, params)
    error = core.add(FRONT, codec.decode_frontend(codec.encode(AddRequest(
        rid, processed.prompt, processed.prompt_token_ids, core_params, 0.0))))
    assert error is None
    completions: dict[int, CompletionOutput] = {}
    prompt_logprobs = None
    finished = False
    while not finished:
        assert core.has_unfinished_requests()
        news = core.step().get(FRONT, [])
        for out in codec.decode_core(codec.encode(CoreOutputs(news))).outputs:
            if not text.owns(rid):
                continue  # sampled before the core heard of the stop
            update = text.update(out)
            for delta in update.outputs:
                prompt_logprobs = delta.prompt_logprobs or prompt_logprobs
                for c in delta.outputs:
                    merge_delta(completions, c)
            for msg in stop_messages(rid, update):
                core.stop(codec.decode_frontend(codec.encode(msg)))
            finished = update.finished
    while core.has_unfinished_requests():  # stopped samples finish their step
        core.step()
    freed = engine.scheduler.kv.usage == 0 and not core.owner
    return [completions[i] for i in sorted(completions)], prompt_logprobs, freed


def stop_messages(rid: str, update) -> list[StopSamples]:
    msgs = []
    if update.stopped_samples:
        msgs.append(StopSamples(rid, update.stopped_samples))
    if update.stop_request:
        msgs.append(StopSamples(rid))
    return msgs


def merge_delta(completions: dict[int, CompletionOutput],
                delta: CompletionOutput) -> None:
    got = completions.get(delta.index)
    if got is None:
        completions[delta.index] = dataclasses.replace(
            delta, token_ids=list(delta.token_ids),
            logprobs=None if delta.logprobs is None else list(delta.logprobs))
        return
    got.text += delta.text
    got.token_ids += delta.token_ids
    if delta.logprobs is not None:
        got.logprobs = (got.logprobs or []) + delta.logprobs
    got.cumulative_logprob = delta.cumulative_logprob
    got.finish_reason = delta.finish_reason
    got.stop_reason = delta.stop_reason


def assert_same(llm, params: SamplingParams):
    expected = llm.generate(PROMPT, params, use_tqdm=False)[0]
    got, prompt_logprobs, freed = split_generate(llm, params)
    assert freed
    assert len(got) == len(expected.outputs)
    for g, e in zip(got, expected.outputs):
        assert (g.index, g.text, g.token_ids, g.finish_reason, g.stop_reason) == (
            e.index, e.text, e.token_ids, e.finish_reason, e.stop_reason)
        assert g.logprobs == e.logprobs
        assert g.cumulative_logprob == pytest.approx(e.cumulative_logprob)
    assert prompt_logprobs == expected.prompt_logprobs
    return expected


GREEDY = dict(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("include", [False, True])
def test_stop_inside_one_token(llm, reference, include):
    stop = found(stop_inside_one_token(*reference))
    out = assert_same(llm, SamplingParams(**GREEDY, stop=[stop],
                                          include_stop_str_in_output=include))
    assert out.outputs[0].stop_reason == stop
    assert out.outputs[0].text.endswith(stop) == include


@pytest.mark.parametrize("include", [False, True])
def test_stop_spanning_tokens(llm, reference, include):
    stop = found(stop_spanning_tokens(*reference))
    out = assert_same(llm, SamplingParams(**GREEDY, stop=[stop], logprobs=2,
                                          prompt_logprobs=1,
                                          include_stop_str_in_output=include))
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]].decoded_token


@pytest.mark.parametrize("seed", [3, 4])
def test_n2_one_sample_stops_the_other_goes_on(llm, seed):
    """Seeded samples differ: a stop string found in sample 0's text only
    ends sample 0 (freed in the core) while sample 1 runs to max_tokens."""
    sampled = dict(temperature=1.0, seed=seed, n=2, max_tokens=24,
                   ignore_eos=True, logprobs=1)
    free = llm.generate(PROMPT, SamplingParams(**sampled), use_tqdm=False)[0]
    first, second = (c.text for c in free.outputs)
    stop = next((first[i:i + 3] for i in range(len(first) // 3, len(first) - 3)
                 if first[i:i + 3].strip() and first[i:i + 3] not in second),
                None)
    if stop is None:
        pytest.skip("the samples' texts share every three characters")
    out = assert_same(llm, SamplingParams(**sampled, stop=[stop]))
    assert out.outputs[0].stop_reason == stop
    assert out.outputs[1].finish_reason == "length"


def test_token_ids_only(llm):
    out = assert_same(llm, SamplingParams(**GREEDY, detokenize=False, logprobs=1))
    assert out.outputs[0].text == ""


def test_special_tokens_and_min_tokens(llm, reference):
    stop = found(stop_spanning_tokens(*reference))
    assert_same(llm, SamplingParams(**GREEDY, stop=[stop], min_tokens=3,
                                    skip_special_tokens=False,
                                    spaces_between_special_tokens=False))
