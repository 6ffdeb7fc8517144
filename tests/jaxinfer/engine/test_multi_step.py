"""Multi-step decode (``num_scheduler_steps``, vLLM's multi-step
scheduling) changes how many tokens the host reads per round trip, never
which tokens: the same workload gives the same outputs with it on and off,
with overlap on and off (greedy, seeded sampling, stop strings, max_tokens,
preemption, an abort mid-run), leaves no page held, and falls back to
single steps where a request needs the host between tokens."""

from __future__ import annotations

import random

import pytest

from jaxinfer import SamplingParams
from jaxinfer.errors import InvalidConfigError
from jaxinfer.worker.step_functions import WINDOW_LOOPS

from .conftest import random_prompts
from .test_overlap import _pages_all_free, _params, _run

pytestmark = pytest.mark.slow


def _windows(engine) -> list[int]:
    """Records the num_steps of every step the runner is given."""
    seen: list[int] = []
    dispatch = engine.runner.dispatch

    def spy(out, *rest):
        if out.scheduled:
            seen.append(out.num_steps)
        return dispatch(out, *rest)
    engine.runner.dispatch = spy
    return seen


@pytest.mark.parametrize("overlap,blocks", [(True, None), (False, 20)],
                         ids=["overlap-roomy", "serial-preempting"])
def test_outputs_identical_with_multi_step_on_and_off(make_llm, overlap, blocks):
    prompts = random_prompts(8, seed=5)
    results, windows = {}, {}
    for k in (1, 4):
        llm = make_llm(async_scheduling=overlap, num_gpu_blocks_override=blocks,
                       num_scheduler_steps=k)
        engine = llm.llm_engine
        windows[k] = _windows(engine)
        rng = random.Random(11)
        params = [_params(rng, engine.tokenizer) for _ in prompts]
        results[k] = _run(engine, prompts, params, abort_id="4", abort_after=4)
        assert _pages_all_free(engine)
    assert results[4] == results[1]
    assert "4" not in results[4]  # aborted before it finished
    assert {"stop", "length"} <= {r[2] for r in results[4].values()}
    assert set(windows[1]) == {1}
    assert 4 in windows[4]  # some steps really ran four decodes


def test_one_stream_reads_k_tokens_per_round_trip(make_llm):
    """A lone greedy stream of 19 tokens: the prefill samples the first,
    then windows of 4 while 4 more fit under max_tokens, then single steps;
    streamed deltas add up to the same tokens as without multi-step."""
    sp = SamplingParams(max_tokens=19, temperature=0.0, ignore_eos=True,
                        output_kind=1)  # DELTA
    got = {}
    for k in (1, 4):
        llm = make_llm(num_scheduler_steps=k)
        engine = llm.llm_engine
        windows = _windows(engine)
        engine.add_request("a", {"prompt_token_ids": [5, 6, 7, 8, 9]}, sp)
        deltas = []
        while engine.has_unfinished_requests():
            deltas += [o.outputs[0].token_ids for o in engine.step()]
        got[k] = (deltas, windows)
    deltas, windows = got[4]
    tokens = sum(deltas, [])
    assert tokens == sum(got[1][0], []) and len(tokens) == 19
    assert windows.count(4) == 4 and len(windows) < len(got[1][1]) - 10
    # Every token reaches the stream, a window's four in one delta.
    assert max(len(d) for d in deltas) == 4
    assert max(len(d) for d in got[1][0]) == 1


@pytest.mark.parametrize("extra,singles", [
    (dict(logprobs=2), 99), (dict(repetition_penalty=1.2), 99),
    # EOS is banned until 6 tokens are out: windows may start after that.
    (dict(min_tokens=6), 6)], ids=["logprobs", "penalty", "min_tokens"])
def test_requests_needing_the_host_run_single_steps(make_llm, extra, singles):
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, **extra)
    outs = {}
    for k in (1, 4):
        llm = make_llm(num_scheduler_steps=k)
        windows = _windows(llm.llm_engine)
        out = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], sp,
                           use_tqdm=False)[0].outputs[0]
        outs[k] = (out.token_ids, None if out.logprobs is None else
                   [sorted(d) for d in out.logprobs])
        assert set(windows[:singles]) == {1}
    assert outs[4] == outs[1]


def test_num_scheduler_steps_must_be_positive(make_llm):
    with pytest.raises(InvalidConfigError, match="num_scheduler_steps"):
        make_llm(num_scheduler_steps=0)


def test_warmup_builds_the_windows_too(make_llm):
    """With warm-up, a run whose decodes go in windows compiles nothing:
    each decode bucket's window program is built with the bucket."""
    from tests.compile_events import compile_events
    # A small bucket set: warm-up builds every program of it.
    llm = make_llm(warmup=True, max_num_seqs=2, max_num_batched_tokens=16,
                   max_model_len=48, num_gpu_blocks_override=12,
                   num_scheduler_steps=4)
    windows = _windows(llm.llm_engine)
    with compile_events() as events:
        for sp in (SamplingParams(max_tokens=14, temperature=0.0),
                   SamplingParams(max_tokens=14, temperature=0.8, seed=3),
                   SamplingParams(max_tokens=14, temperature=0.8, top_p=0.9)):
            llm.generate([{"prompt_token_ids": [5, 6, 7]},
                          {"prompt_token_ids": [9, 10]}], sp, use_tqdm=False)
    assert 4 in windows
    assert events == [], f"{len(events)} compilations after warm-up"


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_a_window_ends_at_a_stop_id_sampled_inside_it(make_llm, loop):
    """A lone request whose stop id it samples inside a window: the output
    ends at the stop, as with single steps. The engine's "scan" windows run
    on to the window's end (the host drops what follows the stop); a
    "while" window skips its later steps on the device (their tokens stay
    0)."""
    import numpy as np
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    free = make_llm().generate([prompt], SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True),
        use_tqdm=False)[0].outputs[0].token_ids
    # Output 1 opens the first window (output 0 comes from the prefill).
    j = next(j for j in (2, 3) if free[j] not in free[:j])
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                        stop_token_ids=[free[j]])
    outs, raw = {}, []
    for k in (1, 4):
        llm = make_llm(num_scheduler_steps=k)
        runner = llm.llm_engine.runner
        if k > 1:
            runner.programs.use_window_loop(loop)
        collect = runner.collect

        def spy(step, collect=collect):
            res = collect(step)
            if step.res is not None and np.ndim(step.res.token_ids) == 2:
                raw.append(np.asarray(step.res.token_ids)[:, 0].tolist())
            return res
        runner.collect = spy
        out = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
        outs[k] = (out.token_ids, out.finish_reason)
    assert outs[4] == outs[1] == (free[:j + 1], "stop")
    assert raw[0][:j] == free[1:j + 1]
    assert raw[0][j:] == ([0] * (4 - j) if loop == "while" else free[j + 1:5])


def test_window_loops_sample_the_same_tokens(make_llm):
    """The three ways of looping a window give the single steps' tokens."""
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 10]}]
    sp = SamplingParams(max_tokens=10, temperature=0.8, seed=11, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in
            make_llm().generate(prompts, sp, use_tqdm=False)]
    for loop in WINDOW_LOOPS:
        llm = make_llm(num_scheduler_steps=4)
        llm.llm_engine.runner.programs.use_window_loop(loop)
        got = [o.outputs[0].token_ids for o in
               llm.generate(prompts, sp, use_tqdm=False)]
        assert got == want, loop
