"""Logits after penalties, bias, allowed / bad words and min_tokens equal a
plain NumPy reference; the host packing and the device count buffers are
exercised together, over several steps."""

from __future__ import annotations

import jax
import numpy as np

from jaxinfer.core.scheduler_output import NewRequestData, ScheduledRequest
from jaxinfer.request import Request, banned_ids
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.worker.penalties import PenaltyState, count_tokens, update_penalty_state
from jaxinfer.worker.sampler import process_logits
from jaxinfer.worker.sampling_inputs import SamplingInputs

from .reference import processed_logits

V = 64
EOS = 2


@jax.jit
def _process(logits, md, state):
    if md.penalties is not None:
        state = update_penalty_state(state, md.penalties)
    return process_logits(logits, md, state), state


def _request(rid, prompt, output, **kw):
    sp = SamplingParams(max_tokens=50, **kw)
    sp._bad_words_token_ids = kw.get("bad_words") and [[7], [9, 10, 11]]
    req = Request(rid, prompt, sp, eos_token_ids=(EOS,))
    req.output_token_ids = list(output)
    return req


def _joined(req) -> NewRequestData:
    return NewRequestData(req.request_id, req.all_token_ids,
                          req.num_prompt_tokens, req.sampling_params)


def _reference(req, logits):
    sp = req.sampling_params
    banned = banned_ids(req)
    return processed_logits(
        logits, req.prompt_token_ids, req.output_token_ids,
        presence=sp.presence_penalty, frequency=sp.frequency_penalty,
        repetition=sp.repetition_penalty, bias=sp.logit_bias,
        allowed=sp.allowed_token_ids, banned=banned)


def test_processing_matches_numpy_over_steps():
    rng = np.random.default_rng(0)
    reqs = [
        _request("pen", [3, 4, 4, 5, 60], [6, 6, 7], presence_penalty=0.7,
                 frequency_penalty=0.4, repetition_penalty=1.3),
        _request("bias", [1, 2, 3], [9], logit_bias={5: 4.0, 9: -2.5}),
        _request("allowed", [8, 9], [], allowed_token_ids=[1, 4, 9, 33]),
        _request("bad", [9, 10], [3, 9, 10], bad_words=["x", "y"],
                 min_tokens=10, stop_token_ids=[12]),
        _request("plain", [1, 1], [2]),
        _request("neg", [11, 12, 13], [13, 14], repetition_penalty=0.6,
                 presence_penalty=-1.0),
    ]
    # What the runner is sent when each request joins (its tokens so far).
    requests = {r.request_id: _joined(r) for r in reqs}
    inputs = SamplingInputs(V, max_num_seqs=8, engine_seed=0, count_width=32)
    state = PenaltyState.zeros(inputs.slots.rows, V)
    S = 8
    for step in range(4):
        sched = []
        for r in reqs:
            if step == 0 and r.request_id == "pen":
                # Its first tokens came from the prefix cache: counted
                # before the step, from the row's earlier tokens.
                toks, start = r.all_token_ids[2:], 2
            elif step == 0:  # prefill (with any earlier output, as on resuming)
                toks, start = r.all_token_ids, 0
            else:  # decode: feeds the previous step's token
                toks, start = r.all_token_ids[-1:], r.num_tokens - 1
            sched.append(ScheduledRequest(r.request_id, toks, start, [], True,
                                          len(r.output_token_ids),
                                          banned_ids(r)))
        md = inputs.build(sched, requests, S)
        for chunk in inputs.take_count_chunks():
            state = count_tokens(state, chunk.reset_slots, chunk.count_ids,
                                 chunk.count_slots, chunk.count_is_output)
        logits = rng.normal(0, 3, (S, V)).astype(np.float32)
        got, state = _process(logits, md, state)
        got = np.asarray(got)
        for i, r in enumerate(reqs):
            want = _reference(r, logits[i])
            np.testing.assert_array_equal(np.isinf(got[i]), np.isinf(want),
                                          err_msg=r.request_id)
            fin = np.isfinite(want)
            np.testing.assert_allclose(got[i][fin], want[fin], rtol=1e-5,
                                       atol=1e-5, err_msg=r.request_id)
        for r in reqs:  # the next token: random, sometimes a repeat
            r.output_token_ids.append(int(rng.choice([6, 9, 10, 13, 20])))


def test_multi_token_bad_word_bans_only_after_its_prefix():
    req = _request("b", [1], [5, 9], bad_words=["z"])
    assert 11 not in banned_ids(req) and 7 in banned_ids(req)
    req.output_token_ids = [5, 9, 10]
    assert 11 in banned_ids(req)


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    req = _request("m", [1], [4], min_tokens=2, stop_token_ids=[12])
    assert set(banned_ids(req)) == {EOS, 12}
    req.output_token_ids.append(5)
    assert banned_ids(req) == []
    req = _request("i", [1], [], min_tokens=2, ignore_eos=True)
    assert banned_ids(req) == []


def test_unused_features_stay_off_the_device():
    req = _request("p", [1, 2], [])
    md = SamplingInputs(V, 4, 0).build(
        [ScheduledRequest("p", [1, 2], 0, [], True)], {"p": _joined(req)}, 4)
    assert md.penalties is None and md.bias_ids is None
    assert md.token_bitmask is None
    assert md.top_k is None and md.top_p is None and md.min_p is None


def test_top_k_in_rounds_equals_lax_top_k():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxinfer.worker.logprob_ops import top_k_in_rounds
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (5, 300)).astype(np.float32)
    x[0, :40] = 1.5  # ties spanning rounds
    x[1] = np.round(x[1])
    for k in (1, 16, 17, 20, 33):
        v, i = top_k_in_rounds(jnp.asarray(x), k)
        ev, ei = jax.lax.top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(np.asarray(v), np.asarray(ev))
        np.testing.assert_array_equal(np.asarray(i), np.asarray(ei))


def test_bias_lists_pad_to_the_widths_fixed_at_start():
    """Bias lists of 1 to 16 entries share one width; longer ones take the
    next of `bias_widths`, the last being the vocabulary."""
    from jaxinfer.worker.sampler_widths import bias_widths

    def width(n):
        req = _request("w", [1], [], logit_bias=dict.fromkeys(range(n), 1.0))
        md = SamplingInputs(V, 4, 0).build(
            [ScheduledRequest("w", [1], 0, [], True)], {"w": _joined(req)}, 4)
        assert md.bias_values.shape == md.bias_ids.shape
        return md.bias_ids.shape[1]

    assert bias_widths(V) == (16, V)
    assert {width(n) for n in (1, 3, 16)} == {16}
    assert {width(n) for n in (17, V)} == {V}


def test_any_extra_feature_takes_the_full_tier():
    """A batch using any of allowed ids, bans, bias, penalties or logprobs
    gets every one of them (one compiled variant per bias width), the
    unused ones neutral: the logits are as if only the used one were
    applied."""
    import jax.numpy as jnp

    req = _request("b", [1], [], logit_bias={5: 3.0})
    md = SamplingInputs(V, 4, 0).build(
        [ScheduledRequest("b", [1], 0, [], True)], {"b": _joined(req)}, 4)
    assert md.penalties is not None and md.token_bitmask is not None
    assert md.top_k is not None and md.temperature is not None
    assert bool(np.all(np.asarray(md.token_bitmask) == -1))
    state = PenaltyState.zeros(5, V)
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, V)),
                         jnp.float32)
    want = np.asarray(logits).copy()
    want[0, 5] += 3.0
    got, _ = _process(logits, md, state)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    plain = _request("p", [1], [])
    md = SamplingInputs(V, 4, 0).build(
        [ScheduledRequest("p", [1], 0, [], True)], {"p": _joined(plain)}, 4,
        wants_logprobs=[True])
    assert md.penalties is not None


def test_long_earlier_tokens_are_counted_in_chunks():
    """A fresh slot's earlier tokens longer than the count width are
    counted C at a time; the counts equal counting them at once."""
    req = _request("h", list(range(3, 40)), [7, 7, 8], presence_penalty=0.5)
    inputs = SamplingInputs(V, 4, 0, count_width=16)
    md = inputs.build([ScheduledRequest("h", [8], req.num_tokens - 1, [],
                                        True)], {"h": _joined(req)}, 4)
    chunks = inputs.take_count_chunks()
    assert len(chunks) == 3  # 39 earlier tokens, 16 at a time
    state = PenaltyState.zeros(inputs.slots.rows, V)
    for c in chunks:
        state = count_tokens(state, c.reset_slots, c.count_ids, c.count_slots,
                             c.count_is_output)
    state = update_penalty_state(state, md.penalties)
    slot = int(md.penalties.slots[0])
    counts = np.asarray(state.output_counts)[slot]
    assert counts[7] == 2 and counts[8] == 1 and counts.sum() == 3
    mask = np.asarray(state.prompt_mask)[slot]
    assert set(np.flatnonzero(mask)) == set(range(3, 40))
