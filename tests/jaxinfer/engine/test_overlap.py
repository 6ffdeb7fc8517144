"""Host/device overlap (async scheduling) changes when the host reads tokens,
never which tokens: the same workload gives the same outputs with it on and
off (greedy, seeded sampling, stop strings, max_tokens, preemption, an
abort mid-run), and leaves no page held."""

from __future__ import annotations

import random

import pytest

from jaxinfer import SamplingParams

from .conftest import random_prompts

pytestmark = pytest.mark.slow


def _params(rng: random.Random, tok) -> SamplingParams:
    kind = rng.choice(["greedy", "seeded", "stop"])
    if kind == "greedy":
        return SamplingParams(max_tokens=rng.randrange(1, 20), temperature=0.0)
    if kind == "seeded":
        return SamplingParams(max_tokens=rng.randrange(1, 20), temperature=1.0,
                              top_p=rng.choice([1.0, 0.9]),
                              seed=rng.randrange(1000), ignore_eos=True)
    # Single letters: the tiny random model's text hits them within 24
    # tokens, so some requests end on a stop string.
    return SamplingParams(max_tokens=24, temperature=0.0,
                          stop=[rng.choice("aeiou"), rng.choice("nrst")])


def _run(engine, prompts, params, abort_id=None, abort_after=3):
    ids = [engine.add_request(str(i), {"prompt_token_ids": p}, sp)
           for i, (p, sp) in enumerate(zip(prompts, params))]
    final, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        steps += 1
        if steps == abort_after and abort_id is not None:
            engine.abort_request(abort_id)
    return {i: (final[i].outputs[0].token_ids, final[i].outputs[0].text,
                final[i].outputs[0].finish_reason) for i in ids if i in final}


def _pages_all_free(engine) -> bool:
    pool = engine.scheduler.kv.pool
    return (pool.num_free == pool.num_blocks - 1
            and not engine.scheduler.kv.block_tables)


@pytest.mark.parametrize("blocks", [None, 20], ids=["roomy", "preempting"])
def test_outputs_identical_with_overlap_on_and_off(make_llm, blocks):
    prompts = random_prompts(24, seed=3)
    results, engines = {}, {}
    for overlap in (False, True):
        llm = make_llm(async_scheduling=overlap,
                       num_gpu_blocks_override=blocks)
        engine = llm.llm_engine
        rng = random.Random(7)
        params = [_params(rng, engine.tokenizer) for _ in prompts]
        results[overlap] = _run(engine, prompts, params, abort_id="5")
        engines[overlap] = engine
        assert _pages_all_free(engine)
    assert results[True] == results[False]
    assert "5" not in results[True]  # aborted before it finished
    reasons = {r[2] for r in results[True].values()}
    assert {"stop", "length"} <= reasons
    if blocks is not None:
        assert engines[True].scheduler.num_preemptions > 0


def test_overlap_really_overlaps(make_llm):
    """With overlap, step N+1 is enqueued before step N's tokens are read:
    some step carries a token the host has not seen (fed on the device)."""
    llm = make_llm(async_scheduling=True)
    engine = llm.llm_engine
    seen_pending = []
    dispatch = engine.runner.dispatch

    def spy(out, *rest):
        seen_pending.append(any(-1 in s.token_ids for s in out.scheduled))
        return dispatch(out, *rest)
    engine.runner.dispatch = spy
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}],
                       SamplingParams(max_tokens=8, temperature=0.0),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8
    assert any(seen_pending)


def test_requests_needing_every_token_run_without_overlap(make_llm):
    """Penalties count the tokens so far: such a batch is never scheduled
    with a pending token, and gives the same tokens as without overlap."""
    sp = SamplingParams(max_tokens=10, temperature=0.0, repetition_penalty=1.3,
                        ignore_eos=True)
    outs = {}
    for overlap in (False, True):
        llm = make_llm(async_scheduling=overlap)
        engine = llm.llm_engine
        dispatch = engine.runner.dispatch
        pending = []
        engine.runner.dispatch = lambda o, *rest: (pending.append(
            any(-1 in s.token_ids for s in o.scheduled)), dispatch(o, *rest))[1]
        outs[overlap] = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], sp,
                                     use_tqdm=False)[0].outputs[0].token_ids
        assert not any(pending)
    assert outs[True] == outs[False]


def test_finished_requests_are_forgotten_even_on_an_idle_step(make_llm):
    """A step with nothing to run still tells the runner which requests
    finished (their penalty slots and state are dropped): request after
    request, more than there are slots, never runs out of them."""
    llm = make_llm()
    engine = llm.llm_engine
    runner = engine.runner
    sp = SamplingParams(max_tokens=2, temperature=0.0, presence_penalty=0.5)
    for i in range(engine.scheduler_config.max_num_seqs + 3):
        engine.add_request(f"p{i}", {"prompt_token_ids": [5, 6, 7]}, sp)
        while engine.has_unfinished_requests():
            engine.step()
        engine.step()  # idle: only the finished request to report
        assert not runner.requests
    assert len(runner.sampling_inputs.slots._free) == \
        runner.sampling_inputs.slots.scratch


def test_a_step_needing_a_new_program_waits_for_the_tokens_in_flight(make_llm):
    """A step whose bucket has no program yet is dispatched only after the
    step in flight is read (its tokens are returned first, not held for the
    build); steps in buckets already built still overlap."""
    llm = make_llm(async_scheduling=True)
    engine = llm.llm_engine
    events = []
    dispatch, finish = engine.runner.dispatch, engine._finish

    def spy_dispatch(out, *rest):
        events.append(("dispatch", engine.runner.programs.bucket(out)[3]))
        return dispatch(out, *rest)

    def spy_finish(inflight):
        events.append(("finish", inflight.out.scheduled[0].request_id))
        return finish(inflight)

    engine.runner.dispatch, engine._finish = spy_dispatch, spy_finish
    engine.add_request("a", {"prompt_token_ids": [5, 6, 7]},
                       SamplingParams(max_tokens=4, temperature=0.0,
                                      ignore_eos=True))
    first_tokens_at = None
    calls = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        calls += 1
        if first_tokens_at is None and any(o.outputs[0].token_ids for o in outs):
            first_tokens_at = calls
    # The prefill, then its tokens, then the first decode step (a new bucket).
    assert events[:3] == [("dispatch", False), ("finish", "a"),
                          ("dispatch", True)], events
    assert first_tokens_at == 2
    # The second decode step (same bucket) is dispatched before the first
    # decode step is read: overlap holds once the program exists.
    assert events[3:5] == [("dispatch", True), ("finish", "a")], events
    assert _pages_all_free(engine)


def test_an_abort_while_a_step_waits_for_its_program_frees_everything(make_llm):
    """A request aborted between the deferred step's scheduling and its
    dispatch: the step still runs (its row writes into the freed pages
    before anyone reuses them), the aborted request gets no more tokens,
    the other request's tokens are those of a run without the abort."""
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = {"a": [5, 6, 7], "b": [9, 10, 11, 12]}

    def run(abort: bool):
        engine = make_llm(async_scheduling=True).llm_engine
        for rid, p in prompts.items():
            engine.add_request(rid, {"prompt_token_ids": p}, greedy)
        engine.step()  # the prefill is dispatched
        engine.step()  # its tokens come back; the decode step waits
        assert engine._deferred is not None
        if abort:
            engine.abort_request("a")
        final = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out.outputs[0].token_ids
        return final, engine

    base, _ = run(abort=False)
    got, engine = run(abort=True)
    assert "a" not in got and got["b"] == base["b"]
    assert _pages_all_free(engine)


def test_a_deferred_step_left_when_every_request_ended_runs_harmlessly(make_llm):
    """A request that stops on its first token (a stop id the scheduler
    cannot foresee) ends when the prefill's token is read, after its decode
    step was scheduled and deferred. The next request's run dispatches that
    stale step first; its tokens and the pages come out as on a fresh
    engine."""
    llm = make_llm(async_scheduling=True)
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": [5, 6, 7]}
    first_token = llm.generate([prompt], SamplingParams(
        max_tokens=1, temperature=0.0), use_tqdm=False)[0].outputs[0].token_ids[0]
    stop_at_first = SamplingParams(max_tokens=5, temperature=0.0,
                                   stop_token_ids=[first_token])
    out = llm.generate([prompt], stop_at_first, use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == [first_token]
    assert engine._deferred is not None and not engine.has_unfinished_requests()
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    other = {"prompt_token_ids": [9, 10, 11]}
    got = llm.generate([other], greedy, use_tqdm=False)[0].outputs[0].token_ids
    fresh = make_llm(async_scheduling=False).generate(
        [other], greedy, use_tqdm=False)[0].outputs[0].token_ids
    assert list(got) == list(fresh)
    assert engine._deferred is None
    assert _pages_all_free(engine)
