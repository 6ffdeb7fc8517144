"""Logits against a tied embedding table: on CPU, 2-32 float32 rows are a
multiply and a sum (not XLA's matmul, which reads the table at half the
rate for so few rows); the result is the matmul's within float32 rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models.layers import CPU_REDUCTION_ROWS, rows_times_table


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 32, 33])
def test_equals_the_matmul(rows):
    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, 48), np.float32))
    table = jnp.asarray(rng.standard_normal((300, 48), np.float32))
    got = jax.jit(rows_times_table)(x, table)
    want = np.asarray(x, np.float64) @ np.asarray(table, np.float64).T
    assert got.shape == (rows, 300)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def _has_dot(rows, dtype=jnp.float32) -> bool:
    x = jax.ShapeDtypeStruct((rows, 48), dtype)
    table = jax.ShapeDtypeStruct((300, 48), dtype)
    text = jax.jit(rows_times_table).lower(x, table).as_text()
    return "dot_general" in text


def test_only_decode_sized_float32_batches_take_the_reduction():
    lo, hi = CPU_REDUCTION_ROWS
    assert _has_dot(lo - 1) and _has_dot(hi + 1)
    assert _has_dot(8, jnp.bfloat16)  # other dtypes keep the matmul
    if jax.default_backend() == "cpu":
        assert not _has_dot(lo) and not _has_dot(8) and not _has_dot(hi)
