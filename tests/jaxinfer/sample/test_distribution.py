"""Empirical token frequencies under temperature / top-k / top-p / min-p
match the analytically filtered distribution (chi-square, fixed seeds)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxinfer.worker.sampler import SamplingMetadata, sample

from .reference import filtered_probs

V = 12
N = 6000
LOGITS = np.array([2.0, 1.6, 1.5, 1.0, 0.7, 0.4, 0.0, -0.3, -0.8, -1.0,
                   -1.7, -2.5], np.float32)

CASES = {
    "temperature": dict(temperature=0.8),
    "hot": dict(temperature=1.7),
    "top_k": dict(temperature=1.0, top_k=4),
    "top_p": dict(temperature=1.0, top_p=0.7),
    "min_p": dict(temperature=1.2, min_p=0.15),
    "all": dict(temperature=0.9, top_k=6, top_p=0.85, min_p=0.05),
}

@jax.jit
def _sample(logits, md):
    return sample(logits, md).token_ids


def draw(seed_base, temperature, top_k=0, top_p=1.0, min_p=0.0):
    full = lambda v, dt: jnp.full((N,), v, dt)
    md = SamplingMetadata(
        temperature=full(temperature, jnp.float32),
        seeds=jnp.arange(seed_base, seed_base + N, dtype=jnp.uint32),
        positions=jnp.zeros(N, jnp.int32),
        top_k=full(top_k, jnp.int32), top_p=full(top_p, jnp.float32),
        min_p=full(min_p, jnp.float32))
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (N, V))
    return np.asarray(_sample(logits, md))


@pytest.mark.parametrize("name", list(CASES))
def test_frequencies_match_filtered_distribution(name):
    kw = CASES[name]
    expected = filtered_probs(LOGITS, **kw)
    tokens = draw(1000, **kw)
    counts = np.bincount(tokens, minlength=V)
    support = expected > 0
    # Filtered-out tokens are never drawn.
    assert counts[~support].sum() == 0, (counts, expected)
    if name not in ("temperature", "hot"):  # the filters must actually remove something
        assert (~support).any()
    _, p = stats.chisquare(counts[support], N * expected[support])
    assert p > 0.01, (name, counts, N * expected)


def test_chi_square_detects_a_wrong_distribution():
    """The test has power: samples at temperature 1.7 fail against 0.8."""
    tokens = draw(1000, temperature=1.7)
    counts = np.bincount(tokens, minlength=V)
    _, p = stats.chisquare(counts, N * filtered_probs(LOGITS, temperature=0.8))
    assert p < 1e-6


def test_greedy_rows_take_the_argmax_and_ignore_filters():
    md = SamplingMetadata(
        temperature=jnp.array([0.0, 1.0], jnp.float32),
        seeds=jnp.array([1, 2], jnp.uint32), positions=jnp.zeros(2, jnp.int32),
        top_k=jnp.array([1, 1], jnp.int32))
    logits = jnp.asarray(np.stack([LOGITS[::-1], LOGITS]))
    tokens = np.asarray(_sample(logits, md))
    assert tokens.tolist() == [V - 1, 0]
