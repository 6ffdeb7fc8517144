"""The runner's vectorized packing equals a plain per-request loop."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxinfer.worker.buckets import Buckets
from jaxinfer.worker.model_runner import ModelRunner
from jaxinfer.worker.step_programs import StepPrograms

B = 16


class _NoSampling:
    def build(self, sched, requests, S, wants_logprobs=()):
        return None


def _runner():
    r = ModelRunner.__new__(ModelRunner)  # prepare needs only these five
    r.programs = StepPrograms.__new__(StepPrograms)  # (of them, its buckets)
    r.programs.buckets = Buckets.make(1024, 64, 64)
    r.prev_rows = {}  # no input reads the step before's tokens here
    r.block_size = B
    r.sampling_inputs = _NoSampling()
    r.requests = {}
    return r


def _reference(sched, T, S, P):
    ids, pos, slots = (np.zeros(T, np.int32) for _ in range(3))
    tables = np.zeros((S, P), np.int32)
    kv_lens, logits_idx = np.zeros(S, np.int32), np.zeros(S, np.int32)
    cu = np.zeros(S + 1, np.int32)
    t = 0
    for i, s in enumerate(sched):
        for j, tok in enumerate(s.token_ids):
            p = s.start_pos + j
            ids[t], pos[t] = tok, p
            slots[t] = s.block_table[p // B] * B + p % B
            t += 1
        tables[i, :len(s.block_table)] = s.block_table
        kv_lens[i] = s.start_pos + len(s.token_ids)
        cu[i + 1:] = t
        logits_idx[i] = t - 1
    return ids, pos, slots, tables, kv_lens, cu, logits_idx


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400),
                          st.one_of(st.just(1), st.integers(1, 24)),
                          st.integers(0, 3)), min_size=1, max_size=40),
       st.integers(0, 2**31))
def test_prepare_matches_a_per_request_loop(reqs, seed):
    rng = np.random.default_rng(seed)
    sched = []
    for i, (start, n, extra_pages) in enumerate(reqs):
        pages = (start + n + B - 1) // B + extra_pages  # tables may run ahead
        sched.append(ScheduledRequest(
            f"r{i}", rng.integers(0, 50000, n).tolist(), start,
            rng.integers(1, 10**6, pages).tolist(), True))
    total = sum(len(s.token_ids) for s in sched)
    if total > 1024 or max(len(s.block_table) for s in sched) > 64:
        return
    out = SchedulerOutput(sched, total, [], [], [], [])
    ids, pos, md, logits_idx, _ = _runner().prepare(out)
    T, (S, P) = len(ids), md.block_tables.shape
    want = _reference(sched, T, S, P)
    got = (ids, pos, md.slot_mapping, md.block_tables, md.kv_lens, md.cu_q_lens,
           logits_idx)
    for w, g in zip(want, got):
        assert g.dtype == np.int32
        np.testing.assert_array_equal(g, w)
    assert md.num_seqs.tolist() == [len(sched)]
    # Decode-only exactly when every request brings one token: then the
    # kernels may take row s as sequence s's token.
    assert md.decode_only == all(len(s.token_ids) == 1 and s.sample
                                 for s in sched)
    if md.decode_only:
        np.testing.assert_array_equal(md.cu_q_lens[:len(sched) + 1],
                                      np.arange(len(sched) + 1))


def test_decode_only_flag_on_a_decode_step_and_a_mixed_one():
    decode = [ScheduledRequest("a", [5], 40, [3, 4, 7], True),
              ScheduledRequest("b", [9], 3, [2], True)]
    mixed = decode + [ScheduledRequest("c", [1, 2, 3], 0, [8], True)]
    # One token inside its prompt (not sampled): a prefill step.
    mid_prompt = decode + [ScheduledRequest("d", [4], 7, [6], False)]
    for sched, want in ((decode, True), (mixed, False), (mid_prompt, False)):
        total = sum(len(s.token_ids) for s in sched)
        out = SchedulerOutput(sched, total, [], [], [], [])
        _, _, md, _, _ = _runner().prepare(out)
        assert md.decode_only is want
