"""The sort-free top-k/top-p path decides exactly what the full-row sort
decides, and hands the batch to the sort whenever it cannot."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.worker.sampler import (
    SamplingMetadata,
    _filter_by_bisection,
    _filter_by_sorting_rows,
    _temperature_and_min_p,
    _threshold_from_candidates,
    filter_logits,
)
from jaxinfer.worker.top_candidates import count_at_least, top_candidates, top_k_values_and_ids

S, V = 6, 203  # V not a multiple of the block: the pad path runs too
KEPT, BLOCK = 3, 8  # a 24-entry head, so both outcomes happen often
# The candidates' two forms: blocks (GPU) and XLA's TopK (CPU), each with
# a head of about the same size.
FORMS = {"blocks": dict(kept_blocks=KEPT, block_size=BLOCK, by_top_k=False),
         "top_k": dict(kept_blocks=KEPT * BLOCK, block_size=BLOCK,
                       by_top_k=True)}


def batch(seed: int):
    """Random rows with the awkward cases: ties (rounded rows, as bf16
    logits give), -inf runs (bans, whitelists), flat and peaked rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, rng.choice([0.3, 2.0, 8.0], (S, 1)), (S, V))
    x = np.where(rng.random((S, 1)) < 0.4, np.round(x), x)
    x[rng.random((S, V)) < rng.choice([0.0, 0.5, 0.97], (S, 1))] = -np.inf
    x[:, 0] = np.maximum(x[:, 0], -50.0)  # at least one finite entry per row
    md = SamplingMetadata(
        temperature=jnp.asarray(rng.choice([0.0, 0.7, 1.0, 1.6], S), jnp.float32),
        seeds=jnp.arange(S, dtype=jnp.uint32), positions=jnp.zeros(S, jnp.int32),
        top_k=jnp.asarray(rng.choice([0, 1, 2, 5, 20, 30, 300], S), jnp.int32),
        top_p=jnp.asarray(rng.choice([1.0, 0.95, 0.5, 0.1], S), jnp.float32),
        min_p=jnp.asarray(rng.choice([0.0, 0.0, 0.05], S), jnp.float32))
    return jnp.asarray(x, jnp.float32), md


@functools.partial(jax.jit, static_argnames="form")
def _decide(x, md, form="blocks"):
    x = _temperature_and_min_p(x, md)
    f = FORMS[form]
    thr, exact = _threshold_from_candidates(x, md, f["kept_blocks"],
                                            f["block_size"], f["by_top_k"])
    return (np.float32(0) + jnp.where(x >= thr[:, None], x, -jnp.inf), exact,
            _filter_by_sorting_rows(x, md))


@pytest.mark.parametrize("form", FORMS)
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_rows_the_candidates_decide_equal_the_full_sort(form, seed):
    x, md = batch(seed)
    fast, exact, by_sort = map(np.asarray, _decide(x, md, form))
    np.testing.assert_array_equal(fast[exact], by_sort[exact])
    # And the public filter equals the sort on every sampled row, whichever
    # path ran (greedy rows take the argmax and are not filtered).
    sampled = np.asarray(md.temperature) > 0
    np.testing.assert_array_equal(
        np.asarray(filter_logits(x, md, **FORMS[form]))[sampled],
        by_sort[sampled])


@jax.jit
def _whole_rows(x, md):
    x = _temperature_and_min_p(x, md)
    return _filter_by_bisection(x, md), _filter_by_sorting_rows(x, md)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_bisection_keeps_exactly_what_the_sort_keeps(seed):
    """CPU's whole-row path (no sort) against the sort, on every row:
    ties, -inf runs, top-k past the row's finite entries, top-p = 1."""
    by_bisection, by_sort = map(np.asarray, _whole_rows(*batch(seed)))
    np.testing.assert_array_equal(by_bisection, by_sort)


def test_bisection_treats_signed_zeros_as_one_value():
    """-0.0 == 0.0 as floats but not as bits: a top-k that cuts inside a
    run of zeros of both signs keeps the whole run, as the sort does."""
    x = jnp.asarray([[1.0, -0.0, 0.0, -0.0, 0.0, -1.0, -2.0]], jnp.float32)
    md = SamplingMetadata(temperature=jnp.ones(1), top_k=jnp.asarray([2]),
                          top_p=jnp.asarray([0.999], jnp.float32))
    by_bisection, by_sort = map(np.asarray, _whole_rows(x, md))
    np.testing.assert_array_equal(by_bisection, by_sort)
    assert np.isfinite(by_bisection).sum() == 5


@pytest.mark.parametrize("form", FORMS)
def test_both_outcomes_occur(form):
    """The property above is not vacuous: over fixed seeds the candidates
    decide most rows and hand some to the sort."""
    decided = undecided = 0
    for seed in range(40):
        exact = np.asarray(_decide(*batch(seed), form)[1])
        decided += exact.sum()
        undecided += (~exact).sum()
    assert decided > 100 and undecided > 10, (decided, undecided)


@pytest.mark.parametrize("by_top_k", [False, True], ids=["blocks", "top_k"])
def test_head_holds_everything_above_its_floor(by_top_k):
    rng = np.random.default_rng(1)
    x = np.round(rng.normal(0, 3, (8, 1000))).astype(np.float32)
    c = top_candidates(jnp.asarray(x), kept_blocks=5, block_size=16,
                       by_top_k=by_top_k)
    values, ids, floor = map(np.asarray, (c.values, c.ids, c.floor))
    assert (values[:, :-1] >= values[:, 1:]).all()  # descending
    padded = ids >= x.shape[1]  # the pad past V: -inf, never a real id
    assert (values[padded] == -np.inf).all()
    assert padded.any() != by_top_k  # only blocks pad past V
    np.testing.assert_array_equal(
        np.take_along_axis(x, np.where(padded, 0, ids), 1)[~padded],
        values[~padded])
    for r in range(8):
        above = np.sort(x[r][x[r] > floor[r]])[::-1]
        np.testing.assert_array_equal(values[r, :above.size], above)
        assert (values[r] >= floor[r]).sum() >= 5
    assert (np.asarray(count_at_least(jnp.asarray(x), c.floor))
            >= np.asarray(count_at_least(c.values, c.floor))).all()


def test_a_row_with_fewer_finite_entries_than_kept_keeps_them_all():
    """TopK's form: floor is -inf when the kept entries run into -inf, so
    every finite entry is a candidate (top-k past them is exact)."""
    x = jnp.asarray([[3.0, -jnp.inf, 1.0, -jnp.inf, 2.0, -jnp.inf]])
    c = top_candidates(x, kept_blocks=4, by_top_k=True)
    assert np.asarray(c.floor)[0] == -np.inf
    np.testing.assert_array_equal(np.asarray(c.values)[0, :3], [3.0, 2.0, 1.0])
    md = SamplingMetadata(temperature=jnp.ones(1), top_k=jnp.asarray([5]),
                          top_p=jnp.ones(1, jnp.float32))
    _, exact = _threshold_from_candidates(x, md, 4, 2, True)
    assert bool(np.asarray(exact)[0])


@pytest.mark.parametrize("by_top_k", [False, True], ids=["blocks", "top_k"])
def test_top_k_values_equal_lax_top_k(by_top_k):
    rng = np.random.default_rng(2)
    x = rng.normal(0, 2, (5, 3000)).astype(np.float32)
    x[0, :200] = 4.0  # ties across many blocks
    x[1] = np.round(x[1])
    for k in (1, 16, 20, 64):
        v, i = top_k_values_and_ids(jnp.asarray(x), k, by_top_k=by_top_k)
        ev, _ = jax.lax.top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(np.asarray(v), np.asarray(ev))
        np.testing.assert_array_equal(
            np.take_along_axis(x, np.asarray(i), 1), np.asarray(v))


def test_cpu_filter_takes_the_top_k_without_sorting_rows():
    """On CPU the filter's candidates are XLA's TopK of the row, not a sort
    of it: with TopK's ids unused, XLA:CPU would turn it into a full-row
    sort (about 30 times slower at the embedded model's vocabulary)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the CPU program's form")
    s, v = 4, 1024
    md = SamplingMetadata(temperature=jnp.ones(s), top_k=jnp.full(s, 4, jnp.int32),
                          top_p=jnp.ones(s, jnp.float32), min_p=jnp.zeros(s))
    hlo = jax.jit(lambda x: filter_logits(x, md, kept_blocks=8)).lower(
        jnp.zeros((s, v))).compile().as_text()
    assert 'custom_call_target="TopK"' in hlo
    assert f"f32[{s},{v}]{{1,0}} sort(" not in hlo
