"""Building the next decode bucket's program in the background
(worker/build_ahead.py): the decode steps use what was built ahead, the
tokens are the same as without it, and nothing is built for a request
that will not decode. A first request's programs build while the weights
load, and are dropped when the weights or pages load in another layout
than guessed."""

from __future__ import annotations

import concurrent.futures
import logging
import sys
import time

import jax
import pytest

from jaxinfer import SamplingParams
from jaxinfer.worker import build_ahead as ba
from jaxinfer.worker import step_programs, warmup
from jaxinfer.worker.buckets import Bucket
from jaxinfer.worker.build_ahead import BuildAhead

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _run(engine, prompt, max_tokens):
    engine.add_request("r", {"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=max_tokens, **GREEDY))
    tokens, pending = [], set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = list(out.outputs[0].token_ids)
        pending |= set(engine.runner.programs.build_ahead._building)
    return tokens, pending


def _bucket(runner, pages):
    """The decode-only bucket of one sequence over ``pages`` pages."""
    return Bucket(*runner.programs.buckets.pick(1, 1, pages, True), True)


def _decode_keys(runner):
    return {k for k in runner.programs.built if k[0] == "forward" and k[1][3]}


def test_decode_steps_take_the_program_built_ahead(make_llm, monkeypatch):
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD", raising=False)
    engine = make_llm(max_num_seqs=4).llm_engine
    runner = engine.runner
    prompt = list(range(5, 45))  # 40 tokens: decode at pages 3, then 5
    tokens, pending = _run(engine, prompt, max_tokens=40)
    assert len(tokens) == 40
    # After the prefill's last chunk was dispatched: its decode bucket (3
    # pages) and the one 32 tokens further (5 pages: the next page bucket).
    near, far = (_bucket(runner, 3), _bucket(runner, 5))
    assert near[2] < far[2]
    assert {k[1] for k in pending} == {near, far}
    # Both were taken by the decode steps, as compiled programs (jit's own
    # path would have left runner.programs without them).
    assert runner.programs.build_ahead.pending() == 0
    built = _decode_keys(runner)
    assert {k[1] for k in built} == {near, far}
    assert all(isinstance(runner.programs.built[k], jax.stages.Compiled)
               for k in built)

    # The same tokens with it off; then every decode step builds through
    # jit on first use, and nothing lands in runner.programs.
    monkeypatch.setenv("JAXINFER_BUILD_AHEAD", "0")
    off = make_llm(max_num_seqs=4).llm_engine
    tokens_off, pending_off = _run(off, prompt, max_tokens=40)
    assert tokens_off == tokens
    assert pending_off == set() and not _decode_keys(off.runner)


def test_nothing_is_built_for_a_request_that_does_not_decode(make_llm,
                                                             monkeypatch):
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD", raising=False)
    engine = make_llm(max_num_seqs=4).llm_engine
    tokens, pending = _run(engine, list(range(5, 25)), max_tokens=1)
    assert len(tokens) == 1
    assert pending == set() and not _decode_keys(engine.runner)


def test_lookahead_stops_at_max_tokens(make_llm, monkeypatch):
    """40 prompt tokens and 8 more never reach the 4-page bucket's end, so
    only that bucket is built."""
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD", raising=False)
    engine = make_llm(max_num_seqs=4).llm_engine
    _, pending = _run(engine, list(range(5, 45)), max_tokens=8)
    assert {k[1] for k in pending} == {_bucket(engine.runner, 3)}


def test_no_decode_build_while_a_prompt_still_prefills(make_llm, monkeypatch):
    """A short request decodes while a long prompt prefills in 16-token
    chunks: the steps with a chunk that does not sample ask for no decode
    build (the next step is not decode-only, and the decode step after the
    last chunk has one row more), and every build that was asked for is
    taken by a step: none is left over."""
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD", raising=False)
    engine = make_llm(max_num_seqs=4, max_num_batched_tokens=16).llm_engine
    runner = engine.runner
    asked = []
    real = runner.programs.build_ahead.decode_buckets_after

    def recording(out, requests):
        dims = real(out, requests)
        asked.append((all(s.sample for s in out.scheduled), dims))
        return dims
    monkeypatch.setattr(runner.programs.build_ahead, "decode_buckets_after",
                        recording)
    sp = SamplingParams(max_tokens=12, **GREEDY)
    engine.add_request("short", {"prompt_token_ids": list(range(5, 10))}, sp)
    engine.add_request("long", {"prompt_token_ids": list(range(5, 60))}, sp)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    assert set(done) == {"short", "long"} and all(len(t) == 12
                                                  for t in done.values())
    mixed = [dims for all_sample, dims in asked if not all_sample]
    assert mixed and all(dims == [] for dims in mixed)
    assert any(dims for all_sample, dims in asked if all_sample)
    assert runner.programs.build_ahead.pending() == 0


def test_a_first_step_in_another_bucket_cancels_the_queued_guesses():
    """`drop_missed_first`: a first step outside start_first's guessed
    bucket cancels the guessed builds that have not started (and ends their
    count for the switch interval); the one running is left to finish; a
    first step in the guessed bucket cancels nothing."""
    _until_no_builds_run()

    class Programs:
        @staticmethod
        def bucket(out):
            return out  # the tests pass the step's bucket as the step

    guessed = (16, 1, 1, False)
    for first_step, expect_cancelled in (((64, 8, 4, False), 2),
                                         (guessed, 0)):
        ahead = BuildAhead(Programs())
        keys = [("forward", guessed), ("sample", 0), ("forward", (1, 1, 1, True))]
        futures = [concurrent.futures.Future() for _ in keys]
        assert futures[0].set_running_or_notify_cancel()  # being built
        for key, future in zip(keys, futures):
            ba._build_started()
            ahead._building[key] = future
        ahead._first_guess = (guessed, keys)
        assert ahead.drop_missed_first(first_step) == expect_cancelled
        assert ba._builds_running == 3 - expect_cancelled
        assert ahead.drop_missed_first((64, 8, 4, False)) == 0  # once only
        left = set(ahead._building)
        assert ("forward", guessed) in left
        assert len(left) == 3 - expect_cancelled
        for _ in left:  # the builds left end as their threads would
            ba._build_done()
    assert ba._builds_running == 0


def test_a_failed_build_is_left_to_the_step(caplog):
    ahead = BuildAhead(programs=None)
    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("lowering failed"))
    ahead._building[("forward", (16, 1, 4, True))] = failed
    with caplog.at_level(logging.WARNING, logger="jaxinfer.worker.build_ahead"):
        assert ahead.take(("forward", (16, 1, 4, True))) is None
    assert "building it on first use" in caplog.text
    assert ahead.pending() == 0
    assert ahead.take(("forward", (16, 1, 8, True))) is None  # never started


def _wait_for_builds(runner):
    for future in list(runner.programs.build_ahead._building.values()):
        future.result()


def _until_no_builds_run(timeout_s: float = 120.0) -> None:
    """Builds an earlier test's engine left running (a sampler nobody
    asked for) hold the short switch interval; wait them out."""
    deadline = time.monotonic() + timeout_s
    while ba._builds_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ba._builds_running == 0


def test_a_first_request_takes_the_programs_built_while_loading(
        make_llm, monkeypatch):
    """The tiny model is under BUILD_FIRST_MIN_PARAMS; with the floor at 0
    its engine starts the first request's programs in its constructor, and
    a short prompt's prefill and decode steps run them (same tokens as an
    engine that builds nothing ahead)."""
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD", raising=False)
    monkeypatch.setattr(step_programs, "BUILD_FIRST_MIN_PARAMS", 0)
    _until_no_builds_run()
    interval = sys.getswitchinterval()
    engine = make_llm(max_num_seqs=4).llm_engine
    runner = engine.runner
    prefill, decode = ba.first_request_buckets(runner.programs.buckets)
    assert not prefill[3] and decode[3]
    started = set(runner.programs.build_ahead._building)
    assert {k[1] for k in started if k[0] == "forward"} == {prefill, decode}
    # Greedy and sampled samplers for each step size (prefill S, decode S).
    samplers = {k for k in started if k[0] == "sample"}
    assert len(samplers) == 2 * len({prefill[1], decode[1]})
    prompt = list(range(5, 12))  # 7 tokens: the smallest token bucket
    tokens, _ = _run(engine, prompt, max_tokens=6)
    forward = {k[1] for k in runner.programs.built if k[0] == "forward"}
    assert {prefill, decode} <= forward
    assert all(isinstance(p, jax.stages.Compiled)
               for p in runner.programs.built.values())
    _wait_for_builds(runner)  # the sampled samplers, never asked for
    _until_no_builds_run(10.0)  # the last one's bookkeeping
    assert sys.getswitchinterval() == interval  # restored once all are done

    monkeypatch.setenv("JAXINFER_BUILD_AHEAD", "0")
    off = make_llm(max_num_seqs=4).llm_engine
    assert not off.runner.programs.build_ahead._building
    assert _run(off, prompt, max_tokens=6)[0] == tokens


def test_a_wrong_guess_drops_the_forward_programs(make_llm, monkeypatch):
    """Pages allocated with another page count than guessed: the forward
    programs (which read them) are dropped, the samplers (which do not)
    stay, and the request builds its own programs."""
    monkeypatch.setenv("JAXINFER_BUILD_AHEAD", "0")
    engine = make_llm(max_num_seqs=4).llm_engine
    runner = engine.runner
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD")
    state = runner.expected_state()
    state.kv_pages = runner.placement.kv_structs(
        runner.cfg.num_layers, runner.num_blocks + 1, runner.block_size,
        runner.kv_dtype)
    assert runner.programs.build_ahead.start_first(state)
    assert not runner.programs.build_ahead.confirm_first(runner.params,
                                                         runner.kv_pages)
    left = set(runner.programs.build_ahead._building)
    assert left and all(k[0] == "sample" for k in left)
    tokens, _ = _run(engine, list(range(5, 12)), max_tokens=4)
    assert len(tokens) == 4
    _wait_for_builds(runner)


def test_a_first_request_layout_that_fails_queues_nothing(make_llm,
                                                          monkeypatch, caplog):
    """An error while laying out the first request's programs (here the
    sampler's metadata) is logged; no build was queued, and the engine
    builds on first use."""
    monkeypatch.delenv("JAXINFER_BUILD_AHEAD", raising=False)
    monkeypatch.setattr(step_programs, "BUILD_FIRST_MIN_PARAMS", 0)

    def broken(*args):
        raise RuntimeError("no metadata")
    monkeypatch.setattr(warmup, "sampling_metadata_for", broken)
    with caplog.at_level(logging.WARNING, logger="jaxinfer.worker.build_ahead"):
        engine = make_llm(max_num_seqs=4).llm_engine
    assert "could not lay out a first request's programs" in caplog.text
    assert not engine.runner.programs.build_ahead._building
    tokens, _ = _run(engine, list(range(5, 12)), max_tokens=3)
    assert len(tokens) == 3


def test_the_expected_state_is_what_loads(make_llm, monkeypatch):
    """The guess made before loading matches the loaded params and pages
    (so on the default path the programs are kept)."""
    monkeypatch.setenv("JAXINFER_BUILD_AHEAD", "0")
    runner = make_llm(max_num_seqs=4).llm_engine.runner
    state = runner.expected_state()
    assert ba._same_layout(state.params, runner.params)
    assert ba._same_layout(state.kv_pages, runner.kv_pages)
    other = runner.placement.param_structs("bfloat16")
    assert not ba._same_layout(other, runner.params)


def test_the_switch_interval_is_short_only_while_builds_run():
    _until_no_builds_run()
    before = sys.getswitchinterval()
    ba._build_started()
    ba._build_started()
    assert sys.getswitchinterval() == min(before, ba.SWITCH_INTERVAL_S)
    ba._build_done()
    assert sys.getswitchinterval() == min(before, ba.SWITCH_INTERVAL_S)
    ba._build_done()
    assert sys.getswitchinterval() == before


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


def test_close_cancels_the_builds_not_started():
    """An ending engine (`LLMEngine.close`) cancels its queued builds: at
    exit Python would run each before joining the pool's thread, and an
    engine-core process given SIGTERM outlived its stop's deadline so."""
    import threading
    release = threading.Event()

    class Slow:  # jitted.lower(...).compile() blocks until released
        def lower(self, *args):
            return self

        def compile(self):
            release.wait(30)
            return "program"

    import collections
    Key = collections.namedtuple("Key", "kind bucket")
    ahead = BuildAhead(programs=None)
    for i in range(4):
        ahead._submit(Key("forward", i), ba.ProgramBuild(Slow(), (), ()))
    futures = list(ahead._building.values())
    deadline = time.time() + 10
    while not futures[0].running() and time.time() < deadline:
        time.sleep(0.01)
    ahead.close()
    release.set()
    assert futures[0].result(10) == "program"  # the running one finishes
    assert all(f.cancelled() for f in futures[1:])
    assert ahead.enabled is False
