"""fp8 (per-token, per-channel) MLPs with the down projection's input
quantized in one pass by the Pallas kernel (Fp8Weights.gated_kernel)
against XLA's unfused path, and where each path is chosen."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import load_params, model_class, resolve_model
from jaxinfer.models.layers import Linear, ScaledProduct
from jaxinfer.models.quantization import Fp8Weights
from jaxinfer.models.quantization import methods as qm
from jaxinfer.models.runtime import model_constants
from tests.models.forward import packed_prefill_logits


@pytest.fixture(scope="module")
def fp8_files(tiny_model_factory):
    return resolve_model(tiny_model_factory("llama"), quantization="fp8")


def _with_gated(cfg, kernel):
    q = cfg.quantization
    return dataclasses.replace(cfg, quantization=dataclasses.replace(
        q, scheme=dataclasses.replace(q.scheme, gated_kernel=kernel)))


def _kl(p_logits, q_logits) -> float:
    lp = jax.nn.log_softmax(jnp.asarray(p_logits, jnp.float32), -1)
    lq = jax.nn.log_softmax(jnp.asarray(q_logits, jnp.float32), -1)
    return float(jnp.mean(jnp.sum(jnp.exp(lp) * (lp - lq), -1)))


def _fp8_gpu() -> bool:
    if jax.default_backend() != "gpu":
        return False
    return float(getattr(jax.devices()[0], "compute_capability", "0")) >= 8.9


@pytest.mark.parametrize("kernel", [
    "pallas_interpret",
    pytest.param("pallas", marks=pytest.mark.skipif(
        not _fp8_gpu(), reason="the compiled kernel needs an fp8 GPU"))])
def test_the_kernel_path_is_as_close_to_float_as_the_unfused_one(
        fp8_files, tiny_model_factory, monkeypatch, kernel):
    from jaxinfer.pallas_kernels import fp8_gated_quant as fgq
    monkeypatch.setattr(qm, "GATED_KERNEL_MIN_ROWS", 1)  # a 63-token step
    calls = []
    real = fgq.silu_mul_quantize
    monkeypatch.setattr(fgq, "silu_mul_quantize",
                        lambda *a, **k: calls.append(k) or real(*a, **k))
    rng = np.random.default_rng(0)
    ids = [list(rng.integers(3, 1000, n)) for n in (40, 23)]
    logits = {}
    float_files = resolve_model(tiny_model_factory("llama"))
    for name, files in (("float", float_files),
                        ("xla", fp8_files), (kernel, fp8_files)):
        cfg = files.config if name == "float" else _with_gated(files.config,
                                                               name)
        model = model_class(cfg.architecture)(cfg, dtype=jnp.bfloat16)
        params = load_params(dataclasses.replace(files, config=cfg),
                             jnp.bfloat16)
        logits[name] = np.concatenate(packed_prefill_logits(
            model, params, model_constants(model, 64), ids, 16, jnp.bfloat16))
    # The kernel quantized the down projection's input (the layers share
    # one traced body, so it is called once), interpreted.
    assert len(calls) == 1
    assert all(k["interpret"] == (kernel == "pallas_interpret") for k in calls)
    kl_xla = _kl(logits["float"], logits["xla"])
    kl_kernel = _kl(logits["float"], logits[kernel])
    # Its h is not rounded to bf16 before quantizing, so it differs from the
    # unfused path, by less than both differ from the float model.
    assert 0 < _kl(logits["xla"], logits[kernel]) < kl_xla
    assert kl_kernel <= kl_xla * 1.1


def test_steps_of_few_rows_keep_xla_fusions(fp8_files, monkeypatch):
    """Below GATED_KERNEL_MIN_ROWS the down projection computes its input
    with XLA ops (the kernel's one program per row lost at decode sizes)."""
    from jaxinfer.pallas_kernels import fp8_gated_quant as fgq
    calls = []
    monkeypatch.setattr(fgq, "silu_mul_quantize",
                        lambda *a, **k: calls.append(k))
    cfg = _with_gated(fp8_files.config, "pallas_interpret")
    model = model_class(cfg.architecture)(cfg, dtype=jnp.bfloat16)
    params = load_params(dataclasses.replace(fp8_files, config=cfg),
                         jnp.bfloat16)
    ids = [[5, 6, 7], [8, 9]]
    assert 5 < qm.GATED_KERNEL_MIN_ROWS
    packed_prefill_logits(model, params, model_constants(model, 64), ids, 16,
                          jnp.bfloat16)
    assert calls == []


def test_linear_hands_on_scaled_products_only_where_it_can():
    scheme = Fp8Weights(per_channel=True, activation="per_token",
                        gated_kernel="pallas_interpret")
    x = jnp.ones((4, 16), jnp.bfloat16)
    for bias, kernel, want in ((False, "pallas_interpret", ScaledProduct),
                               (True, "pallas_interpret", jax.Array),
                               (False, "xla", jax.Array)):
        layer = Linear((16,), (32,), ("embed", "mlp"), bias, jnp.bfloat16,
                       dataclasses.replace(scheme, gated_kernel=kernel))
        params = layer.init(jax.random.key(0), x, scaled=True)
        out = layer.apply(params, x, scaled=True)
        assert isinstance(out, want), (bias, kernel, type(out))


def test_the_runner_picks_the_kernel_on_one_gpu(fp8_files):
    cfg = fp8_files.config
    assert cfg.quantization.scheme.gated_kernel == "xla"
    on_gpu = qm.with_int4_kernel(cfg, 1, "gpu").quantization.scheme
    assert on_gpu.gated_kernel == "pallas"
    assert qm.with_int4_kernel(cfg, 2, "gpu") is cfg  # sharded: XLA's
    assert qm.with_int4_kernel(cfg, 1, "cpu") is cfg
    per_tensor = dataclasses.replace(cfg, quantization=dataclasses.replace(
        cfg.quantization, scheme=Fp8Weights()))
    assert (qm.with_int4_kernel(per_tensor, 1, "gpu").quantization.scheme
            == Fp8Weights())  # per-tensor activations keep XLA's
    with pytest.raises(ValueError, match="gated_kernel"):
        Fp8Weights(gated_kernel="triton")
