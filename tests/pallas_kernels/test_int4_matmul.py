"""The int4 matmul kernel (interpret mode on CPU) against its jnp
reference and against the model's own grouped layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.pallas_kernels.int4_matmul import (Int4MatmulShapeError,
                                                 Int4MatmulTuning, int4_matmul,
                                                 int4_matmul_reference)


def _case(M, n_in, n_out, groups, dtype, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (M, n_in), jnp.float32).astype(dtype)
    q = jax.random.bits(k[1], (n_out, n_in // 2), jnp.uint8)
    s = (jax.random.uniform(k[2], (n_out, groups)) * 0.01 + 1e-3).astype(
        jnp.float16)
    z = jax.random.bits(k[3], (n_out, groups), jnp.uint8) & 0xF
    return x, q, s, z


@pytest.mark.slow
@pytest.mark.parametrize("scale_on, unroll, form", [
    ("weights", 1, "dot"), ("partials", 2, "dot"), ("weights", 2, "gemv")])
@pytest.mark.parametrize("M, n_in, n_out, groups, splits, dtype", [
    (1, 256, 64, 2, 1, jnp.float32),
    (5, 512, 128, 4, 2, jnp.float32),
    (17, 256, 64, 8, 4, jnp.bfloat16),  # groups of 32: 16-byte steps
    (1, 256, 64, 8, 4, jnp.bfloat16),
])
def test_matches_the_reference(M, n_in, n_out, groups, splits, dtype,
                               scale_on, unroll, form):
    if form == "gemv" and M != 1:
        pytest.skip("the gemv form takes one row (refused: see below)")
    x, q, s, z = _case(M, n_in, n_out, groups, dtype)
    tuning = Int4MatmulTuning(block_n=64, splits=splits, scale_on=scale_on,
                              unroll=unroll, form=form)
    got = int4_matmul(x, q, s, z, tuning=tuning, interpret=True)
    want = int4_matmul_reference(x, q, s, z)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    scale = float(jnp.abs(want.astype(jnp.float32)).max())
    assert got.shape == (M, n_out) and got.dtype == dtype
    assert float(jnp.abs(got.astype(jnp.float32) - want.astype(
        jnp.float32)).max()) <= tol * scale


def test_the_grouped_layer_can_run_on_it(monkeypatch):
    """The model's GroupedWeights with INT4_MATMUL="pallas" gives its XLA
    product (AWQ's layout: [*O, In / 2] bytes, [*O, G] scales / zeros)."""
    from jaxinfer.models.quantization import methods as qm
    scheme = qm.GroupedWeights(bits=4, group_size=64, zeros=True)
    x, q, s, z = _case(3, 256, 128, 4, jnp.float32, seed=1)

    class Layer:
        in_shape, out_shape, axes = (256,), (2, 64), ("embed", "heads", "x")
    w = {"qweight": q.reshape(2, 64, -1), "scales": s.reshape(2, 64, -1),
         "qzeros": z.reshape(2, 64, -1)}
    want = scheme.apply(Layer, w, x)
    monkeypatch.setattr(qm, "INT4_MATMUL", "pallas")
    got = scheme.apply(Layer, w, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5,
                               rtol=1e-5)


def test_shapes_it_refuses():
    x, q, s, z = _case(2, 256, 64, 16, jnp.float32)  # groups of 16 inputs
    with pytest.raises(Int4MatmulShapeError, match="multiple of 32"):
        int4_matmul(x, q, s, z, interpret=True)
    x, q, s, z = _case(2, 256, 64, 2, jnp.float32)
    with pytest.raises(Int4MatmulShapeError, match="splits=4"):
        int4_matmul(x, q, s, z, tuning=Int4MatmulTuning(splits=4),
                    interpret=True)
    x, q, s, z = _case(2, 256, 96, 2, jnp.float32)
    with pytest.raises(Int4MatmulShapeError, match="block_n=64"):
        int4_matmul(x, q, s, z, tuning=Int4MatmulTuning(splits=1),
                    interpret=True)
    with pytest.raises(ValueError, match="power of two"):
        Int4MatmulTuning(block_n=48)
    with pytest.raises(ValueError, match="scale_on"):
        Int4MatmulTuning(scale_on="codes")
    with pytest.raises(ValueError, match="unroll"):
        Int4MatmulTuning(unroll=0)
    with pytest.raises(ValueError, match="form"):
        Int4MatmulTuning(form="gemm")
    x, q, s, z = _case(2, 256, 64, 2, jnp.float32)
    with pytest.raises(Int4MatmulShapeError, match="one row, got 2"):
        int4_matmul(x, q, s, z, tuning=Int4MatmulTuning(splits=1, form="gemv"),
                    interpret=True)
