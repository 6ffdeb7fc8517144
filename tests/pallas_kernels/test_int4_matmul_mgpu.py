"""The Mosaic GPU int4 kernel against the jnp reference.

On CPU it runs in Mosaic GPU's interpret mode (TMA copies, barriers, the
smem ring and the producer / consumer warpgroups are simulated; the int4
view of the ring, register layouts and register wgmma operands have jnp
stand-ins), and its lowering for CUDA is checked by exporting it (Mosaic's
Python lowering runs; ptxas does not). On a Hopper GPU the ``gpu`` cases
run compiled at llama3-8b's shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxinfer.pallas_kernels.int4_matmul import int4_matmul, int4_matmul_reference
from jaxinfer.pallas_kernels.int4_matmul_mgpu import (
    Int4MosaicTuning,
    Int4MosaicUnsupported,
    int4_matmul_mgpu,
    int4_matmul_mgpu_many,
    plan,
)
from tests.pallas_kernels.cases import gpu, interpreter_on_cpu


def _case(M, n_in, n_out, seed=0, dtype=jnp.bfloat16):
    G = n_in // 128
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (M, n_in), jnp.float32).astype(dtype)
    q = jax.random.bits(k[1], (n_out, n_in // 2), jnp.uint8)
    s = (jax.random.uniform(k[2], (n_out, G)) * 0.01 + 1e-3).astype(
        jnp.float16)
    z = jax.random.bits(k[3], (n_out, G), jnp.uint8) & 0xF
    return x, q, s, z


def _check(M, n_in, n_out, tuning, seed=0, interpret=True):
    x, q, s, z = _case(M, n_in, n_out, seed)
    got = jax.jit(lambda *a: int4_matmul(*a, tuning=tuning,
                                         interpret=interpret))(x, q, s, z)
    _assert_matches(got, x, q, s, z)


def _assert_matches(got, x, q, s, z):
    """``got`` is x @ w.T for these weights: bf16, within 1e-2 of the
    largest output (bf16 output and, in the weights forms, bf16 weights);
    a wrong group, row, nibble or weight set is off by far more."""
    want = int4_matmul_reference(x, q, s, z).astype(jnp.float32)
    assert got.shape == (x.shape[0], q.shape[0])
    assert got.dtype == jnp.bfloat16
    err = float(jnp.abs(got.astype(jnp.float32) - want).max())
    assert err <= 1e-2 * float(jnp.abs(want).max()), err


@interpreter_on_cpu
@pytest.mark.parametrize("M, n_in, n_out, tuning", [
    # Partials form; 16 groups over 2 splits on a 2-slot ring (refills).
    (5, 4096, 128, dict(warpgroups=1, splits=2, num_stages=2,
                        scale_on="partials")),
    # The default ("auto") is the weights form as multiply-adds (fma).
    (3, 2048, 128, dict(warpgroups=1)),
    # Weights form, two consumer warpgroups, two row blocks of x, one
    # program's 32 groups in two scale boxes on a 3-slot ring.
    (17, 4096, 128, dict(warpgroups=2, splits=1, num_stages=3,
                         scale_on="weights", block_rows=16)),
    # The multiply-add form: weights as q * s + (-z * s).
    (2, 2048, 128, dict(warpgroups=1, scale_on="fma")),
])
def test_mosaic_int4_matches_the_reference(M, n_in, n_out, tuning):
    t = Int4MosaicTuning(**tuning)
    p = plan(M, n_out, n_in // 128, t)
    assert p.partials == (tuning.get("scale_on") == "partials")
    assert p.fma == (tuning.get("scale_on", "auto") in ("auto", "fma"))
    _check(M, n_in, n_out, t)


@pytest.mark.parametrize("M, n_out, tuning", [
    (1, 14336, {}),  # llama3-8b gate/up at a decode: weights form
    (1, 14336, dict(scale_on="partials")),
    (256, 4096, dict(warpgroups=4)),  # q/o at 256 rows: weights form
])
def test_mosaic_int4_lowers_for_cuda(M, n_out, tuning):
    """Mosaic's lowering of the compiled kernel (register layouts, the
    int4 view of the ring, register wgmma) runs without a GPU."""
    x, q, s, z = (jax.ShapeDtypeStruct(a.shape, a.dtype) for a in
                  _case(M, 4096, 128))
    q = jax.ShapeDtypeStruct((n_out, 2048), jnp.uint8)
    s = jax.ShapeDtypeStruct((n_out, 32), jnp.float16)
    z = jax.ShapeDtypeStruct((n_out, 32), jnp.uint8)
    t = Int4MosaicTuning(**tuning)
    exported = jax.export.export(
        jax.jit(lambda *a: int4_matmul_mgpu(*a, tuning=t)),
        platforms=["cuda"])(x, q, s, z)
    assert "mosaic_gpu" in exported.mlir_module()


def test_mosaic_int4_refuses_what_it_cannot_take():
    x, q, s, z = _case(2, 2048, 128)
    run = lambda *a, **k: int4_matmul_mgpu(*a, interpret=True, **k)
    with pytest.raises(Int4MosaicUnsupported, match="bf16"):
        run(x.astype(jnp.float32), q, s, z)
    with pytest.raises(Int4MosaicUnsupported, match="128"):  # groups of 64
        run(x, q, jnp.tile(s, (1, 2)), jnp.tile(z, (1, 2)))
    x, q, s, z = _case(2, 1024, 128)  # 8 groups: under one scale box
    with pytest.raises(Int4MosaicUnsupported, match="multiple of 16"):
        run(x, q, s, z)
    x, q, s, z = _case(2, 2048, 64)
    with pytest.raises(Int4MosaicUnsupported, match="multiple of 128"):
        run(x, q, s, z)
    x, q, s, z = _case(2, 6144, 128)  # 48 groups: 2 splits of 24 straddle
    with pytest.raises(Int4MosaicUnsupported, match="splits=2"):
        run(x, q, s, z, tuning=Int4MosaicTuning(splits=2))
    for bad in (dict(warpgroups=3), dict(num_stages=1), dict(block_rows=12),
                dict(scale_on="codes")):
        with pytest.raises(ValueError):
            Int4MosaicTuning(**bad)


@gpu
@pytest.mark.parametrize("M, n_in, n_out, tuning", [
    (1, 4096, 14336, {}),  # gate/up, weights form, 2 splits
    (1, 4096, 14336, dict(scale_on="fma")),
    (256, 4096, 4096, dict(scale_on="fma")),
    (1, 14336, 4096, dict(scale_on="partials")),  # down, 7 splits
    (7, 4096, 1024, dict(warpgroups=1)),  # k/v, 16 splits of 2 groups
    (16, 4096, 4096, dict(scale_on="weights", warpgroups=4)),
    (256, 4096, 14336, {}),  # weights form, two row blocks of 128
    (256, 14336, 4096, dict(block_rows=64, scale_on="partials")),  # 4 blocks
])
def test_mosaic_int4_on_gpu(M, n_in, n_out, tuning):
    """Compiled at llama3-8b's projection shapes."""
    _check(M, n_in, n_out, Int4MosaicTuning(**tuning), seed=M,
           interpret=False)


def _check_many(M, n_in, outs, tuning, interpret=True):
    """One call over weight sets sharing x (q/k/v-like) against each set's
    reference."""
    sets = [_case(M, n_in, n, seed=j)[1:] for j, n in enumerate(outs)]
    x = _case(M, n_in, 128, seed=9)[0]
    got = jax.jit(lambda x, sets: int4_matmul_mgpu_many(
        x, sets, tuning=tuning, interpret=interpret))(x, sets)
    assert len(got) == len(outs)
    for y, (q, s, z) in zip(got, sets):
        _assert_matches(y, x, q, s, z)


@interpreter_on_cpu
@pytest.mark.parametrize("M, outs, tuning", [
    # Three sets of 2, 1 and 1 tiles, one warpgroup: programs land in each.
    (3, (128, 64, 64), dict(warpgroups=1, splits=2, num_stages=2)),
    # Two warpgroups per program: each set a multiple of 128 outputs.
    (2, (256, 128), dict(warpgroups=2, splits=1, num_stages=2)),
])
def test_several_weight_sets_in_one_call(M, outs, tuning):
    _check_many(M, 2048, outs, Int4MosaicTuning(**tuning))


def test_weight_sets_must_share_their_groups():
    x, q, s, z = _case(1, 2048, 128)
    _, q2, s2, z2 = _case(1, 4096, 128)
    with pytest.raises(Int4MosaicUnsupported):
        int4_matmul_mgpu_many(x, [(q, s, z), (q2, s2, z2)], interpret=True)


@gpu
@pytest.mark.parametrize("M, n_in, outs", [
    (1, 4096, (4096, 1024, 1024)),  # llama3-8b q/k/v at a decode
    (16, 4096, (14336, 14336)),  # gate/up
    (256, 4096, (4096, 1024, 1024)),
])
def test_several_weight_sets_on_gpu(M, n_in, outs):
    _check_many(M, n_in, outs, Int4MosaicTuning(), interpret=False)


def test_the_default_picks_mosaic_only_on_hopper(monkeypatch):
    from jaxinfer.pallas_kernels import int4_matmul as i4
    x, q, s, z = _case(3, 2048, 128)
    args = (x.dtype, 2048, 128, 16, s.dtype)
    monkeypatch.setattr(i4, "MOSAIC_MAX_ROWS", 256)
    monkeypatch.setattr(i4, "hopper", lambda: False)  # CPU, or an older GPU
    assert not i4.uses_mosaic(*args, M=3)
    monkeypatch.setattr(i4, "hopper", lambda: True)
    assert i4.uses_mosaic(*args, M=3)
    assert not i4.uses_mosaic(*args, M=3, interpret=True)
    assert not i4.uses_mosaic(*args, M=257)
    assert not i4.uses_mosaic(jnp.float32, *args[1:], M=3)
    monkeypatch.setattr(i4, "MOSAIC_MAX_ROWS", 0)  # off: Triton everywhere
    assert not i4.uses_mosaic(*args, M=1)
