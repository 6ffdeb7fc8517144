"""The int4 matmul kernel (interpret mode on CPU) against its jnp
reference and against the model's own grouped layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.pallas_kernels.int4_matmul import (
    Int4MatmulShapeError,
    Int4MatmulTuning,
    int4_matmul,
    int4_matmul_reference,
)


def _case(M, n_in, n_out, groups, dtype, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (M, n_in), jnp.float32).astype(dtype)
    q = jax.random.bits(k[1], (n_out, n_in // 2), jnp.uint8)
    s = (jax.random.uniform(k[2], (n_out, groups)) * 0.01 + 1e-3).astype(
        jnp.float16)
    z = jax.random.bits(k[3], (n_out, groups), jnp.uint8) & 0xF
    return x, q, s, z


@pytest.mark.slow
@pytest.mark.parametrize("scale_on", ["weights", "partials"])
@pytest.mark.parametrize("M, n_in, n_out, groups, splits, dtype", [
    (1, 256, 64, 2, 1, jnp.float32),
    (5, 512, 128, 4, 2, jnp.float32),
    (17, 256, 64, 8, 4, jnp.bfloat16),  # groups of 32: 16-byte steps
])
def test_matches_the_reference(M, n_in, n_out, groups, splits, dtype,
                               scale_on):
    x, q, s, z = _case(M, n_in, n_out, groups, dtype)
    tuning = Int4MatmulTuning(block_n=64, splits=splits, scale_on=scale_on)
    got = int4_matmul(x, q, s, z, tuning=tuning, interpret=True)
    want = int4_matmul_reference(x, q, s, z)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    scale = float(jnp.abs(want.astype(jnp.float32)).max())
    assert got.shape == (M, n_out) and got.dtype == dtype
    assert float(jnp.abs(got.astype(jnp.float32) - want.astype(
        jnp.float32)).max()) <= tol * scale


def _layer_weights():
    x, q, s, z = _case(3, 256, 128, 4, jnp.float32, seed=1)

    class Layer:
        in_shape, out_shape, axes = (256,), (2, 64), ("embed", "heads", "x")
    w = {"qweight": q.reshape(2, 64, -1), "scales": s.reshape(2, 64, -1),
         "qzeros": z.reshape(2, 64, -1)}
    return Layer, w, x


def test_the_grouped_layer_can_run_on_it(monkeypatch):
    """The model's GroupedWeights with kernel="pallas" gives its XLA
    product (AWQ's layout: [*O, In / 2] bytes, [*O, G] scales / zeros),
    through the kernel up to INT4_KERNEL_MAX_ROWS rows and XLA above."""
    from jaxinfer.models.quantization import methods as qm
    from jaxinfer.pallas_kernels import int4_matmul as i4
    Layer, w, x = _layer_weights()
    xla = qm.GroupedWeights(bits=4, group_size=64, zeros=True)
    on_kernel = qm.GroupedWeights(bits=4, group_size=64, zeros=True,
                                  kernel="pallas")
    calls = []
    real = i4.int4_matmul
    monkeypatch.setattr(i4, "int4_matmul",
                        lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    want = xla.apply(Layer, w, x)
    assert not calls
    got = on_kernel.apply(Layer, w, x)
    assert calls == [(3, 256)]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5,
                               rtol=1e-5)
    monkeypatch.setattr(qm, "INT4_KERNEL_MAX_ROWS", 2)  # 3 rows: XLA's
    np.testing.assert_array_equal(np.asarray(on_kernel.apply(Layer, w, x)),
                                  np.asarray(want))
    assert calls == [(3, 256)]


def test_one_gpu_puts_4_bit_zero_point_layers_on_the_kernel():
    import dataclasses

    from jaxinfer.models.quantization import methods as qm
    from jaxinfer.models.quantization.config import QuantizationConfig

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        quantization: object
    awq = qm.GroupedWeights(bits=4, group_size=128, zeros=True)
    int8 = qm.GroupedWeights(bits=8, group_size=128, signed=True)
    cfg = Cfg(QuantizationConfig("awq", "awq", awq,
                                 overrides=((("lm_head",), int8),
                                            (("layers_0", "mlp"), awq))))
    on_gpu = qm.with_int4_kernel(cfg, 1, "gpu").quantization
    assert on_gpu.scheme.kernel == "pallas"
    assert on_gpu.overrides[0][1] == int8  # 8-bit: XLA's
    assert on_gpu.overrides[1][1].kernel == "pallas"
    assert qm.with_int4_kernel(cfg, 2, "gpu") is cfg  # sharded: XLA's
    assert qm.with_int4_kernel(cfg, 1, "cpu") is cfg
    # Not a checkpoint property: a converted config.json never carries it.
    assert "kernel" not in on_gpu.to_json()["scheme"]
    assert QuantizationConfig.from_json(on_gpu.to_json()).scheme == awq
    with pytest.raises(ValueError, match="kernel"):
        qm.GroupedWeights(bits=4, group_size=128, kernel="triton")


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


