"""int8 and fp8 quantized from a float checkpoint at load, and the products
of the int8 / fp8 methods, against NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.errors import UnsupportedQuantizationError
from jaxinfer.models import load_params, resolve_model
from jaxinfer.models.quantization import Fp8Weights, Int8Weights
from jaxinfer.models.quantization.resolve import linear_weights

E4M3 = ml_dtypes.float8_e4m3fn


@pytest.fixture(scope="module")
def float_dir(tiny_model_factory):
    return tiny_model_factory("llama")


def _hf_weights(folder):
    import os
    return load_file(os.path.join(folder, "model.safetensors"))


def _node(params, path):
    for key in path:
        params = params[key]
    return params


def test_int8_codes_and_scales_equal_numpy(float_dir):
    files = resolve_model(float_dir, quantization="int8")
    params = load_params(files, jnp.float32)
    hf = _hf_weights(float_dir)
    for path, prefix, layout in linear_weights(files.config):
        w = hf[prefix + "weight"].astype(np.float32)  # [out, in]
        scale = np.abs(w).max(1) / np.float32(127)
        codes = np.clip(np.round(w / scale[:, None]), -127, 127)
        node = _node(params, path)
        assert node["weight"].dtype == jnp.int8
        np.testing.assert_array_equal(
            np.asarray(node["weight"]),
            codes.astype(np.int8).reshape(*layout.out_shape, -1))
        np.testing.assert_array_equal(np.asarray(node["weight_scale"]),
                                      scale.reshape(layout.out_shape))


def test_fp8_codes_and_scale_equal_numpy(float_dir):
    files = resolve_model(float_dir, quantization="fp8")
    # Per-channel weights, per-token activations (resolve.at_load says why).
    assert files.config.quantization.scheme == Fp8Weights(
        per_channel=True, activation="per_token")
    params = load_params(files, jnp.float32)
    hf = _hf_weights(float_dir)
    for path, prefix, layout in linear_weights(files.config):
        w = hf[prefix + "weight"].astype(np.float32)  # [out, in]
        scale = np.abs(w).max(1) / np.float32(448)
        codes = np.clip(w / scale[:, None], -448, 448).astype(E4M3)
        node = _node(params, path)
        np.testing.assert_array_equal(
            np.asarray(node["weight"]).view(np.uint8),
            codes.view(np.uint8).reshape(*layout.out_shape, -1))
        np.testing.assert_array_equal(np.asarray(node["weight_scale"]),
                                      scale.reshape(layout.out_shape))


class _Layer:
    """What a LinearMethod reads of its Linear module."""
    def __init__(self, in_shape, out_shape):
        self.in_shape, self.out_shape = in_shape, out_shape
        self.axes = ("embed",) * len(in_shape) + ("mlp",) * len(out_shape)


@pytest.mark.parametrize("activation", ["per_token", "per_tensor", "static",
                                        "none"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_product_equals_numpy_w8a8(activation, per_channel):
    rng = np.random.default_rng(1)
    T, D, N, H = 5, 64, 4, 8
    x = rng.normal(size=(T, D)).astype(np.float32) * np.linspace(
        0.1, 3, T, dtype=np.float32)[:, None]
    codes = rng.normal(size=(N, H, D)).astype(E4M3)
    ws = (rng.uniform(0.01, 0.1, (N, H)) if per_channel
          else np.float64(0.03)).astype(np.float32)
    weights = {"weight": jnp.asarray(codes), "weight_scale": jnp.asarray(ws)}
    if activation == "static":
        weights["input_scale"] = jnp.float32(0.02)
    scheme = Fp8Weights(per_channel=per_channel, activation=activation)
    got = np.asarray(scheme.apply(_Layer((D,), (N, H)), weights,
                                  jnp.asarray(x)))
    w = codes.astype(np.float64) * (ws[..., None] if per_channel else ws)
    if activation == "none":
        xq = x.astype(np.float64)
    else:
        xs = {"per_token": np.abs(x).max(1, keepdims=True) / 448,
              "per_tensor": np.abs(x).max() / 448,
              "static": np.float32(0.02)}[activation]
        xs = np.asarray(xs, np.float32)
        xq = (np.clip(x / xs, -448, 448).astype(E4M3).astype(np.float64) * xs)
    want = np.einsum("td,nhd->tnh", xq, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fp8_dot_writes_the_activations_dtype(monkeypatch):
    """bf16 activations: the fp8 x fp8 dot's result is bf16 (half the bytes
    a float32 result costs the GEMM), scaled after, and within bf16
    rounding of the float32-result product."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(6, 64)), jnp.bfloat16)
    weights = {"weight": jnp.asarray(rng.normal(size=(32, 64)).astype(E4M3)),
               "weight_scale": jnp.asarray(rng.uniform(0.01, 0.1, 32),
                                           jnp.float32)}
    scheme = Fp8Weights(per_channel=True, activation="per_token")
    layer = _Layer((64,), (32,))
    jaxpr = jax.make_jaxpr(lambda x: scheme.apply(layer, weights, x))(x)
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert [d.params["preferred_element_type"] for d in dots] == [jnp.bfloat16]
    got = np.asarray(scheme.apply(layer, weights, x), np.float32)
    from jaxinfer.models.quantization import methods
    monkeypatch.setattr(methods, "FP8_PRODUCT_DTYPE", "float32")
    want = np.asarray(scheme.apply(layer, weights, x), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2)
    assert not np.array_equal(got, np.zeros_like(got))


def test_int8_product_equals_numpy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 2, 8)).astype(np.float32)  # input axes (N, H)
    codes = rng.integers(-127, 128, (32, 16)).astype(np.int8)
    scale = rng.uniform(0.001, 0.01, 32).astype(np.float32)
    got = Int8Weights().apply(_Layer((2, 8), (32,)), {
        "weight": jnp.asarray(codes), "weight_scale": jnp.asarray(scale)},
        jnp.asarray(x))
    want = x.reshape(3, 16) @ (codes * scale[:, None]).T
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_engine_serves_int8_and_fp8(float_dir):
    sp = SamplingParams(max_tokens=6, temperature=0)
    for q, dtype in (("int8", jnp.int8), ("tpu_int8", jnp.int8),
                     ("fp8", jnp.float8_e4m3fn)):
        llm = LLM(float_dir, quantization=q, num_gpu_blocks_override=32,
                  max_model_len=64)
        out = llm.generate(["Hello there"], sp, use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 6
        q_proj = llm.llm_engine.runner.params["layers_0"]["self_attn"]["q_proj"]
        assert q_proj["weight"].dtype == dtype and "kernel" not in q_proj


def test_an_unserved_quantization_is_refused_before_loading(float_dir):
    with pytest.raises(UnsupportedQuantizationError,
                       match="quantization: .*'bitsandbytes'.*awq, gptq"):
        LLM(float_dir, quantization="bitsandbytes")
    with pytest.raises(UnsupportedQuantizationError, match="'int3'"):
        LLM(float_dir, quantization="int3")


def test_abstract_params_of_a_quantized_model_have_their_dtypes(float_dir):
    """What sharding and orbax restore read: codes and scales keep their
    dtypes, and the packed int4 layout halves the input axis."""
    from flax import linen as nn

    from jaxinfer.models import model_class
    from jaxinfer.models.abstract import abstract_variables
    files = resolve_model(float_dir, quantization="int8")
    model = model_class(files.config.architecture)(files.config,
                                                   dtype=jnp.bfloat16)
    abstract = nn.unbox(abstract_variables(model, files.config)["params"])
    o_proj = abstract["layers_0"]["self_attn"]["o_proj"]
    assert (o_proj["weight"].dtype, o_proj["weight"].shape) == (jnp.int8,
                                                                (64, 64))
    assert o_proj["weight_scale"].dtype == jnp.float32
    assert abstract["embedding"].dtype == jnp.bfloat16
    assert jax.tree_util.tree_structure(abstract) is not None
