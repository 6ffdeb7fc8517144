"""The one-pass fp8 quantizer of a gated MLP's hidden state
(pallas_kernels/fp8_gated_quant.py) against NumPy's float32 math: exact in
interpret mode on CPU; within one code step on rare elements when compiled
on a GPU (its exp and division round differently)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxinfer.pallas_kernels.fp8_gated_quant import (
    MAX_WIDTH,
    silu_mul_quantize,
    silu_mul_quantize_reference,
)

E4M3 = ml_dtypes.float8_e4m3fn


def _inputs(T, F, seed=0):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal((T, F)) * 40).astype(ml_dtypes.bfloat16)
    u = (rng.standard_normal((T, F)) * 40).astype(ml_dtypes.bfloat16)
    gr = (np.abs(rng.standard_normal((T, 1))) * 0.01 + 1e-3).astype(np.float32)
    ur = (gr * 1.5).astype(np.float32)
    gc = (np.abs(rng.standard_normal(F)) * 0.01 + 1e-3).astype(np.float32)
    uc = (np.abs(rng.standard_normal(F)) * 0.01 + 1e-3).astype(np.float32)
    g[1] = 0  # an all-zero row: scale at its floor, codes zero
    return g, u, gr, ur, gc, uc


def _numpy(g, u, gr, ur, gc, uc):
    gf = g.astype(np.float32) * gr * gc
    uf = u.astype(np.float32) * ur * uc
    h = (gf * (1 / (1 + np.exp(-gf))) * uf).astype(np.float32)
    scale = np.maximum(np.abs(h).max(-1, keepdims=True) / np.float32(448),
                       np.float32(1e-12)).astype(np.float32)
    return np.clip(h / scale, -448, 448).astype(E4M3), scale


def _code_steps(a, b):
    """|difference| in e4m3 code steps (sign-magnitude bytes)."""
    def ordinal(x):
        bits = np.asarray(x).view(np.uint8).astype(np.int32)
        mag = bits & 0x7F
        return np.where(bits & 0x80, -mag, mag)
    return np.abs(ordinal(a) - ordinal(b))


@pytest.mark.parametrize("T,F,rows", [(5, 200, 1), (3, 1536, 1), (8, 200, 4),
                                      (6, 96, 4)])
def test_interpreted_kernel_equals_numpy(T, F, rows):
    """``rows`` per program (6 rows: 4 does not divide them, so 2)."""
    args = _inputs(T, F)
    codes, scale = silu_mul_quantize(*map(jnp.asarray, args), interpret=True,
                                     rows=rows)
    want_codes, want_scale = _numpy(*args)
    assert codes.dtype == jnp.float8_e4m3fn and scale.shape == (T, 1)
    np.testing.assert_allclose(np.asarray(scale), want_scale, rtol=2e-7)
    np.testing.assert_array_equal(np.asarray(codes).view(np.uint8),
                                  want_codes.view(np.uint8))
    assert not np.asarray(codes.astype(jnp.float32))[1].any()


def test_as_accurate_as_the_unfused_path():
    """Against h in float64, the kernel's dequantized output is no worse
    than XLA's unfused math (which rounds the products to bf16 first)."""
    args = _inputs(4, 512, seed=3)
    codes, scale = silu_mul_quantize(*map(jnp.asarray, args), interpret=True)
    ref_codes, ref_scale = silu_mul_quantize_reference(*map(jnp.asarray, args))
    g, u, gr, ur, gc, uc = (np.asarray(a, np.float64) for a in args)
    gf, uf = g * gr * gc, u * ur * uc
    h = gf / (1 + np.exp(-gf)) * uf

    def err(c, s):
        x = np.asarray(c.astype(jnp.float32), np.float64) * np.asarray(s)
        return np.linalg.norm(x - h) / np.linalg.norm(h)
    assert err(codes, scale) <= err(ref_codes, ref_scale) * 1.01
    assert err(codes, scale) < 0.04  # e4m3's 3 mantissa bits


def test_rows_wider_than_one_program_are_refused():
    x = jnp.zeros((1, MAX_WIDTH + 1), jnp.bfloat16)
    s = jnp.ones((1, 1))
    c = jnp.ones((MAX_WIDTH + 1,))
    with pytest.raises(ValueError, match="at most 32768"):
        silu_mul_quantize(x, x, s, s, c, c, interpret=True)


def _fp8_gpu() -> bool:
    if jax.default_backend() != "gpu":
        return False
    cc = getattr(jax.devices()[0], "compute_capability", "0")
    return float(cc) >= 8.9


@pytest.mark.skipif(not _fp8_gpu(), reason="needs a GPU with fp8 (sm89+)")
@pytest.mark.parametrize("T,F,rows", [(64, 14336, 1), (32, 4096, 1),
                                      (16, 3000, 1), (64, 14336, 4),
                                      (32, 4096, 8)])
def test_compiled_kernel_on_gpu(T, F, rows):
    args = _inputs(T, F, seed=F)
    codes, scale = silu_mul_quantize(*map(jnp.asarray, args), rows=rows)
    want_codes, want_scale = _numpy(*args)
    np.testing.assert_allclose(np.asarray(scale), want_scale, rtol=1e-5)
    steps = _code_steps(np.asarray(codes), want_codes)
    assert steps.max() <= 1 and (steps > 0).mean() < 5e-3
