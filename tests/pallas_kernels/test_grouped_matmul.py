"""The grouped-matmul kernel (interpreted on CPU) against its reference, and
the expert-aligned tile layout it reads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.pallas_kernels.grouped_matmul import (
    GroupedMatmulShapeError,
    GroupedMatmulTuning,
    Int4Weights,
    grouped_gated_matmul,
    grouped_matmul,
    grouped_matmul_reference,
    num_tiles,
    tile_layout,
)


@pytest.mark.parametrize("P,G,bm", [(1, 4, 16), (37, 4, 16), (200, 8, 16),
                                    (64, 128, 16), (300, 3, 64)])
def test_tile_layout_puts_each_group_on_its_own_tiles(P, G, bm):
    rng = np.random.default_rng(P + G)
    group_of = rng.integers(0, G + 1, P).astype(np.int32)  # G: no group
    row, tile_group = map(np.asarray, tile_layout(jnp.asarray(group_of), G, bm))
    tiles = num_tiles(P, G, bm)
    assert tile_group.shape == (tiles,)
    here = group_of < G
    # Pairs of no group go to the dummy row past the tiles; the others to
    # distinct rows of a tile of their own group.
    assert (row[~here] == tiles * bm).all()
    assert len(set(row[here].tolist())) == here.sum()
    assert (tile_group[row[here] // bm] == group_of[here]).all()
    # A group's tiles are contiguous and each starts its group's run.
    for g in range(G):
        rows = np.sort(row[group_of == g])
        if rows.size:
            assert rows[0] % bm == 0
            assert (np.diff(rows) == 1).all()


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_grouped_matmul_equals_the_reference(dtype, tol):
    E, K, N, P, bm = 6, 64, 96, 45, 16
    k0, k1, k2 = jax.random.split(jax.random.key(0), 3)
    group_of = jax.random.randint(k0, (P,), 0, E)
    row, tile_group = tile_layout(group_of, E, bm)
    x = jax.random.normal(k1, (tile_group.shape[0] * bm, K), dtype)
    w = (jax.random.normal(k2, (E, K, N)) * 0.1).astype(dtype)
    tuning = GroupedMatmulTuning(block_m=bm, block_n=32, block_k=32)
    got = grouped_matmul(x, w, tile_group, tuning=tuning, interpret=True)
    want = grouped_matmul_reference(x, w, tile_group, bm)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol)
    # Tiles past the last group's rows hold zeros.
    empty = np.asarray(tile_group) < 0
    assert empty.any()
    assert not np.asarray(got, np.float32).reshape(-1, bm, N)[empty].any()


def test_gated_form_equals_act_of_gate_times_up():
    E, K, N, P, bm = 4, 32, 64, 30, 16
    ks = jax.random.split(jax.random.key(1), 4)
    _, tile_group = tile_layout(jax.random.randint(ks[0], (P,), 0, E), E, bm)
    x = jax.random.normal(ks[1], (tile_group.shape[0] * bm, K))
    gate = jax.random.normal(ks[2], (E, K, N)) * 0.2
    up = jax.random.normal(ks[3], (E, K, N)) * 0.2
    tuning = GroupedMatmulTuning(block_m=bm, block_n=32, block_k=16)
    got = grouped_gated_matmul(x, gate, up, tile_group, act=jax.nn.silu,
                               tuning=tuning, interpret=True)
    want = (jax.nn.silu(grouped_matmul_reference(x, gate, tile_group, bm))
            * grouped_matmul_reference(x, up, tile_group, bm))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_shapes_it_cannot_take_are_refused_saying_what_to_change():
    tile_group = jnp.zeros(2, jnp.int32)
    x = jnp.zeros((32, 64))
    with pytest.raises(GroupedMatmulShapeError, match="block_n=32 must divide N=48"):
        grouped_matmul(x, jnp.zeros((2, 64, 48)), tile_group,
                       tuning=GroupedMatmulTuning(16, 32, 32), interpret=True)
    with pytest.raises(GroupedMatmulShapeError, match="tiles of block_m=16 need 32"):
        grouped_matmul(jnp.zeros((48, 64)), jnp.zeros((2, 64, 64)), tile_group,
                       tuning=GroupedMatmulTuning(16, 32, 32), interpret=True)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiled kernel: GPU only")
@pytest.mark.parametrize("P,E,D,F", [(16, 8, 256, 512), (2048, 8, 512, 384),
                                     (512, 128, 256, 768)])
def test_compiled_grouped_experts_equal_the_dense_loop_on_gpu(P, E, D, F):
    from jaxinfer.models.moe import dense_experts_reference, grouped_experts, route
    ks = jax.random.split(jax.random.key(P), 5)
    T, k = P // 2, 2
    x = jax.random.normal(ks[0], (T, D), jnp.bfloat16)
    gate, up, down = ((jax.random.normal(kk, shape) * 0.05).astype(jnp.bfloat16)
                      for kk, shape in ((ks[1], (E, D, F)), (ks[2], (E, D, F)),
                                        (ks[3], (E, F, D))))
    w, ids = route(jax.random.normal(ks[4], (T, E)), k, True)
    got = jax.jit(lambda *a: grouped_experts(*a, jax.nn.silu, impl="pallas"))(
        x, w, ids, gate, up, down)
    want = dense_experts_reference(x.astype(jnp.float32), w, ids,
                                   *(a.astype(jnp.float32) for a in (gate, up, down)),
                                   jax.nn.silu)
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * float(jnp.abs(want).max()))


@pytest.mark.parametrize("codes", [jnp.int8, jnp.float8_e4m3fn])
def test_quantized_weights_are_widened_and_scaled_per_group_and_output(codes):
    E, K, N, P, bm = 4, 32, 64, 30, 16
    ks = jax.random.split(jax.random.key(2), 5)
    _, tile_group = tile_layout(jax.random.randint(ks[0], (P,), 0, E), E, bm)
    x = jax.random.normal(ks[1], (tile_group.shape[0] * bm, K))
    q = (jax.random.normal(ks[2], (E, K, N)) * 20).astype(codes)
    q_up = (jax.random.normal(ks[3], (E, K, N)) * 20).astype(codes)
    scale = jax.random.uniform(ks[4], (E, N), minval=0.001, maxval=0.01)
    tuning = GroupedMatmulTuning(block_m=bm, block_n=32, block_k=16)
    # Interpreted on a GPU, XLA's float32 dots may round their inputs to
    # TF32 (10-bit mantissas).
    tol = 1e-5 if jax.default_backend() == "cpu" else 3e-3
    got = grouped_matmul(x, q, tile_group, scale, tuning=tuning, interpret=True)
    want = grouped_matmul_reference(x, q, tile_group, bm, scale)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    got = grouped_gated_matmul(x, q, q_up, tile_group, scale, scale * 2,
                               act=jax.nn.silu, tuning=tuning, interpret=True)
    want = (jax.nn.silu(want)
            * grouped_matmul_reference(x, q_up, tile_group, bm, scale * 2))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    with pytest.raises(GroupedMatmulShapeError, match="need their scales"):
        grouped_matmul(x, q, tile_group, tuning=tuning, interpret=True)


def _int4_experts(rng, E, K, N, quant_group):
    """Random 4-bit weights: (Int4Weights, the float32 weights they mean,
    computed here from the unpacked codes)."""
    codes = rng.integers(0, 16, (E, K, N)).astype(np.uint8)
    G = K // quant_group
    zeros = rng.integers(0, 16, (E, G, N)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.05, (E, G, N)).astype(np.float16)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # input 2j low, 2j + 1 high
    group = np.arange(K) // quant_group
    w = ((codes.astype(np.float32) - zeros[:, group].astype(np.float32))
         * scales[:, group].astype(np.float32))
    return Int4Weights(*map(jnp.asarray, (packed, scales, zeros))), w


@pytest.mark.parametrize("quant_group,block_k", [(32, 32), (64, 32), (128, 64)])
def test_int4_weights_are_dequantized_per_scale_group(quant_group, block_k):
    E, K, N, P, bm = 4, 128, 64, 30, 16
    rng = np.random.default_rng(quant_group)
    _, tile_group = tile_layout(jnp.asarray(rng.integers(0, E, P)), E, bm)
    x = jnp.asarray(rng.normal(size=(tile_group.shape[0] * bm, K)), jnp.float32)
    gate, w_gate = _int4_experts(rng, E, K, N, quant_group)
    up, w_up = _int4_experts(rng, E, K, N, quant_group)
    tuning = GroupedMatmulTuning(block_m=bm, block_n=32, block_k=block_k)
    tol = 1e-4 if jax.default_backend() == "cpu" else 3e-3
    want = grouped_matmul_reference(x, jnp.asarray(w_gate), tile_group, bm)
    got = grouped_matmul(x, gate, tile_group, tuning=tuning, interpret=True)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(grouped_matmul_reference(x, gate, tile_group, bm),
                               want, rtol=1e-5, atol=1e-5)
    got = grouped_gated_matmul(x, gate, up, tile_group, act=jax.nn.silu,
                               tuning=tuning, interpret=True)
    want = (jax.nn.silu(want)
            * grouped_matmul_reference(x, jnp.asarray(w_up), tile_group, bm))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_int4_blocks_must_lie_in_one_scale_group():
    rng = np.random.default_rng(0)
    w, _ = _int4_experts(rng, 2, 128, 32, 32)
    x, tile_group = jnp.zeros((32, 128)), jnp.zeros(2, jnp.int32)
    with pytest.raises(GroupedMatmulShapeError, match="divide the 32 inputs"):
        grouped_matmul(x, w, tile_group,
                       tuning=GroupedMatmulTuning(16, 32, 64), interpret=True)
