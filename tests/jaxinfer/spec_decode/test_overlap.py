"""Speculation under host/device overlap (spec_decode/overlap.py): a step
laid out as if the step before accepted every draft, corrected on the
device, is the step laid out from the true counts; and an engine whose
drafter proposes on the device schedules ahead, with the tokens of plain
decoding."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer import SamplingParams
from jaxinfer.core.scheduler_output import ScheduledRequest
from jaxinfer.request import PENDING_TOKEN
from jaxinfer.spec_decode.overlap import row_sources, shift_layout
from jaxinfer.worker.buckets import Bucket
from jaxinfer.worker.packing import pack_step
from jaxinfer.worker.step_layout import lay_out_step

B = 4  # block size
K = 3  # drafts per row


@st.composite
def steps(draw):
    """A step laid out ahead: per row, its start had the step before
    accepted all of its d drafts, how many it accepted, and the new row's
    tokens (a pending first token, then drafts); some rows follow no
    verifying row (d = 0) and one may be a prefill chunk."""
    R = draw(st.integers(1, 5))
    rows = []
    for _ in range(R):
        d = draw(st.integers(0, K))
        accepted = draw(st.integers(0, d))
        true_start = draw(st.integers(1, 40))
        n_new = draw(st.integers(1, K + 1))
        prefill = d == 0 and draw(st.booleans())
        rows.append((d, accepted, true_start, n_new, prefill))
    return rows


def _sched(rows, assumed: bool):
    out = []
    for i, (d, accepted, start, n_new, prefill) in enumerate(rows):
        shift = d - accepted
        s = start + (shift if assumed else 0)
        first = (100 + i if prefill or not assumed else PENDING_TOKEN)
        ids = [first] + [7] * (n_new - 1)
        pages = -(-(s + n_new) // B)
        table = [10 * (i + 1) + p for p in range(pages)]
        out.append(ScheduledRequest(f"r{i}", ids, s, table, True,
                                    num_draft_tokens=n_new - 1))
    return out


@settings(max_examples=60, deadline=None)
@given(steps())
def test_a_layout_made_ahead_and_corrected_is_the_exact_layout(rows):
    S, P, T = 8, 16, 32
    bucket = Bucket(T, S, P, False, 0)
    prev_rows = {f"r{i}": 7 - i for i in range(len(rows))}
    ahead = _sched(rows, assumed=True)
    exact = _sched(rows, assumed=False)
    # The step before's tokens and accepted counts, by its row.
    prev_tokens = np.zeros(8, np.int32)
    prev_accepted = np.zeros(8, np.int32)
    for i, (_, accepted, *_rest) in enumerate(rows):
        prev_tokens[7 - i] = 100 + i
        prev_accepted[7 - i] = accepted
    sources = row_sources(ahead, prev_rows,
                          {f"r{i}": r[0] for i, r in enumerate(rows)})
    want = pack_step(*lay_out_step(exact, (T, S, P), B, {})[:3])
    packed = pack_step(*lay_out_step(ahead, (T, S, P), B, prev_rows)[:3])
    if sources is None:  # every row a prefill chunk: nothing pending
        assert all(r[4] for r in rows)
        np.testing.assert_array_equal(packed, want)
        return
    row, drafts = sources.padded(S)
    got, shift = shift_layout(B, bucket, jnp.asarray(packed),
                              jnp.asarray(prev_accepted), jnp.asarray(row),
                              jnp.asarray(drafts), jnp.asarray(prev_tokens))
    # Block tables of the ahead layout cover the assumed positions: the
    # exact one's pages are their prefix (the same ids here).
    np.testing.assert_array_equal(np.asarray(got), _with_tables(want, packed,
                                                                 (T, S, P)))
    np.testing.assert_array_equal(
        np.asarray(shift)[:len(rows)],
        [0 if r[4] else r[0] - r[1] for r in rows])


def _with_tables(want, ahead, dims):
    from jaxinfer.worker.packing import field_spans
    at, size = field_spans(dims)["block_tables"]
    out = want.copy()
    out[at:at + size] = ahead[at:at + size]
    return out


def test_rows_without_a_pending_token_need_no_correction():
    sched = [ScheduledRequest("a", [5, 7, 7], 9, [1, 2, 3], True,
                              num_draft_tokens=2)]
    assert row_sources(sched, {"a": 0}, {"a": 2}) is None


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "eagle"])
def test_drafting_on_the_device_schedules_ahead(make_llm, spec_case, method):
    """Steps are laid out while the verifying step before them runs, and
    corrected by its accepted counts: greedy and seeded tokens equal plain
    decoding's, drafts are both accepted and rejected, and no page is
    left over."""
    target, config = spec_case(method)
    prompts = [{"prompt_token_ids": list(range(40 + i, 60 + i))}
               for i in range(4)]
    sp = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=3, max_tokens=30,
                         ignore_eos=True)] * 2
    tokens = {}
    for spec in (None, config):
        llm = make_llm(target, speculative_config=spec)
        runner = llm.llm_engine.runner
        corrected = []
        if spec is not None:
            shift_layout_ = runner.shift_layout

            def spy(bucket, packed, sources):
                corrected.append(int(sources.prev_drafts.sum()))
                return shift_layout_(bucket, packed, sources)
            runner.shift_layout = spy
        outs = llm.generate(prompts, sp, use_tqdm=False)
        tokens[spec is None] = [o.outputs[0].token_ids for o in outs]
        if spec is not None:
            # Most steps after the first decode were laid out ahead of a
            # verifying step.
            assert sum(c > 0 for c in corrected) >= 10
            stats = llm.llm_engine.get_stats().spec_decode
            assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
        pool = llm.llm_engine.scheduler.kv.pool
        assert pool.num_free == pool.num_blocks - 1
    assert tokens[True] == tokens[False]


@pytest.mark.slow
@pytest.mark.parametrize("swap", [None, 0.01], ids=["recompute", "swap"])
def test_a_request_preempted_while_its_drafts_are_verified(
        make_llm, spec_case, swap, monkeypatch):
    """With the room check off and a small pool, scheduling ahead preempts
    requests whose verifying step is still in flight: their tokens are
    taken, their rejected drafts given back (pages or host slots), and the
    outputs are still plain decoding's, with no page or host slot left
    over."""
    from jaxinfer.core.scheduler import Scheduler
    from jaxinfer.request import RequestStatus

    from .conftest import repetitive_prompts
    target, config = spec_case("draft_model")
    prompts = [{"prompt_token_ids": p} for p in repetitive_prompts(16, seed=2)]
    params = [SamplingParams(temperature=1.0 if i % 2 else 0.0, seed=i,
                             max_tokens=40, ignore_eos=True)
              for i in range(len(prompts))]
    in_flight = []
    reject = Scheduler.reject_drafts

    def spy(self, output, emitted):
        in_flight.extend(
            r.status for sr in output.scheduled if sr.num_draft_tokens
            and (r := self.requests.get(sr.request_id)) is not None
            and r.status != RequestStatus.RUNNING)
        return reject(self, output, emitted)
    monkeypatch.setattr(Scheduler, "reject_drafts", spy)
    tokens = {}
    for spec in (None, config):
        llm = make_llm(target, speculative_config=spec, swap_space=swap,
                       num_gpu_blocks_override=12)
        kv = llm.llm_engine.scheduler.kv
        monkeypatch.setattr(llm.llm_engine.scheduler, "running_fit",
                            lambda n: True)
        tokens[spec is None] = [o.outputs[0].token_ids for o in
                                llm.generate(prompts, params, use_tqdm=False)]
        assert kv.pool.num_free == kv.pool.num_blocks - 1
        assert kv.host.num_free == kv.host.num_slots
    want = {RequestStatus.PREEMPTED} if swap is None else {
        RequestStatus.SWAPPED}
    assert want <= set(in_flight)
    assert tokens[True] == tokens[False]


def test_a_draft_that_is_the_target_has_every_draft_accepted(make_llm,
                                                             tiny_path):
    """The target as its own draft, greedy, overlap on: every draft is
    accepted, so the draft's K/V of each step laid out ahead (its pending
    first token included) is the target's."""
    from .conftest import draft_config
    prompts = [{"prompt_token_ids": list(range(40 + i, 60 + i))}
               for i in range(3)]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = make_llm(speculative_config=draft_config(tiny_path))
    llm.generate(prompts, sp, use_tqdm=False)
    stats = llm.llm_engine.get_stats().spec_decode
    assert stats.num_draft_tokens >= 30
    assert stats.num_accepted_tokens == stats.num_draft_tokens, stats
