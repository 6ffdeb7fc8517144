"""Mixture-of-experts weights quantized at load (``quantization="int8"`` /
``"fp8"`` on a float checkpoint): codes with one scale per expert and
output feature, multiplied by ragged_dot (CPU) or the grouped-matmul
kernel (interpreted here), and split over two devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models.moe import MoEConfig, grouped_experts, route
from jaxinfer.models.moe_weights import QuantizedExperts, expert_floats, quantize_experts
from jaxinfer.models.quantization.config import QuantizationConfig
from jaxinfer.models.quantization.errors import UnsupportedQuantizationConfigError

PROMPTS = ["Hello, my name is", "The capital of France is",
           "One two three four five six seven eight nine ten " * 3]
ENGINE = dict(num_gpu_blocks_override=64, max_model_len=256,
              max_num_batched_tokens=64, dtype="float32")


@pytest.mark.parametrize("codes,bound", [(jnp.int8, 0.5), (jnp.float8_e4m3fn, 0.07)])
def test_quantized_experts_round_trip_within_half_a_step(codes, bound):
    """int8 codes are within half a step (scale / 2) of the weights; e4m3's
    3-bit mantissa within 1/16 of the weight's magnitude (plus its
    subnormal step)."""
    w = np.random.default_rng(0).normal(size=(3, 32, 8)).astype(np.float32)
    q, scale = quantize_experts(w, codes)
    assert q.dtype == codes and scale.shape == (3, 8)
    back = np.asarray(expert_floats(QuantizedExperts(jnp.asarray(q), jnp.asarray(scale)),
                                    jnp.float32))
    err = np.abs(back - w)
    if codes == jnp.int8:
        assert (err <= bound * scale[:, None, :] + 1e-7).all()
    else:
        assert (err <= bound * np.abs(w) + scale[:, None, :] * 2.0 ** -9).all()
    # The largest weight of each expert and output maps to the top code.
    top = 127 if codes == jnp.int8 else 448
    np.testing.assert_allclose(np.abs(q.astype(np.float32)).max(axis=1), top, rtol=1e-6)


@pytest.mark.parametrize("impl", ["ragged_dot", "pallas_interpret"])
def test_quantized_experts_multiply_as_their_dequantized_weights(impl):
    ks = jax.random.split(jax.random.key(4), 5)
    T, D, F, E, k = 9, 32, 48, 4, 2
    x = jax.random.normal(ks[0], (T, D))
    w, ids = route(jax.random.normal(ks[1], (T, E)), k, True)
    mats = [np.asarray(jax.random.normal(kk, s) * 0.2)
            for kk, s in ((ks[2], (E, D, F)), (ks[3], (E, D, F)), (ks[4], (E, F, D)))]
    quant = [QuantizedExperts(*map(jnp.asarray, quantize_experts(m, jnp.int8)))
             for m in mats]
    got = grouped_experts(x, w, ids, *quant, jax.nn.silu, impl=impl)
    want = grouped_experts(x, w, ids, *(expert_floats(q, jnp.float32) for q in quant),
                           jax.nn.silu, impl="ragged_dot")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_checkpoints_that_ship_quantized_experts_are_refused_naming_what_runs(
        tiny_model_factory):
    from jaxinfer.models import resolve_model
    cfg = resolve_model(tiny_model_factory("mixtral")).config
    import dataclasses
    with pytest.raises(UnsupportedQuantizationConfigError,
                       match="quantization='awq'.*quantization='fp8' or 'int8'"):
        dataclasses.replace(cfg, quantization=QuantizationConfig("awq", "awq"))
    ok = dataclasses.replace(cfg, quantization=QuantizationConfig("int8", "float"))
    assert isinstance(ok, MoEConfig)


@pytest.fixture(scope="module")
def float_logits(tiny_model_factory):
    """The unquantized engine's prefill logits of PROMPTS."""
    from tests.runners import JaxInferRunner
    engine = JaxInferRunner(tiny_model_factory("mixtral"), **ENGINE)
    return engine.prefill_logits([engine.tokenizer.encode(p) for p in PROMPTS])


# quantization="fp8" also quantizes every activation to e4m3 (per tensor):
# coarser than int8 weight-only on a tiny random model.
@pytest.mark.parametrize("method,rel_err,agreement", [("int8", 0.1, 0.8),
                                                      ("fp8", 0.4, 0.6)])
def test_engine_quantizes_the_experts_at_load(tiny_model_factory, float_logits,
                                              method, rel_err, agreement):
    from tests.runners import JaxInferRunner
    path = tiny_model_factory("mixtral")
    ours = JaxInferRunner(path, quantization=method, **ENGINE)
    mlp = ours.engine.runner.params["layers_1"]["mlp"]
    codes = jnp.int8 if method == "int8" else jnp.float8_e4m3fn
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert mlp[name]["weight"].dtype == codes
        assert mlp[name]["weight_scale"].shape == (4, mlp[name]["weight"].shape[2])
    # Quantizing every weight moves the logits a little, not the argmax of
    # most positions.
    ids = [ours.tokenizer.encode(p) for p in PROMPTS]
    got, want = ours.prefill_logits(ids), float_logits
    scale = max(float(np.abs(w).max()) for w in want)
    err = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    assert 0 < err < rel_err * scale
    agree = np.mean(np.concatenate([g.argmax(-1) == w.argmax(-1)
                                    for g, w in zip(got, want)]))
    assert agree >= agreement


_TP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import LLM, SamplingParams
    path, engine = sys.argv[1], json.loads(sys.argv[2])
    prompts = json.loads(sys.argv[3])
    sp = SamplingParams(max_tokens=12, temperature=0)
    out = {}
    for tp in (1, 2):
        llm = LLM(path, tensor_parallel_size=tp, quantization="int8", **engine)
        outs = llm.generate(prompts, sp, use_tqdm=False)
        mlp = llm.llm_engine.runner.params["layers_0"]["mlp"]["gate_proj"]
        out[tp] = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                   "codes_spec": list(map(str, mlp["weight"].sharding.spec)),
                   "scale_spec": list(map(str, mlp["weight_scale"].sharding.spec))}
        del llm
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
def test_quantized_experts_split_over_two_devices_give_one_devices_tokens(
        tiny_model_factory):
    path = tiny_model_factory("mixtral")
    proc = subprocess.run(
        [sys.executable, "-c", _TP_SCRIPT, path, json.dumps(ENGINE),
         json.dumps(PROMPTS)], capture_output=True, text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    assert out["2"]["tokens"] == out["1"]["tokens"]
    # Four experts over two devices: split by expert, codes and scales alike.
    assert out["2"]["codes_spec"][0] == "model"
    assert out["2"]["scale_spec"][0] == "model"


def write_fp8_mixtral(src: str, dst: str) -> dict:
    """A compressed-tensors fp8 checkpoint of a float Mixtral folder, as
    llm-compressor writes one: every Linear (the experts' w1/w2/w3
    included, the router not) as e4m3 codes with per-channel scales,
    dynamic per-token activations. Returns the experts' codes and scales
    by tensor name."""
    import ml_dtypes

    from tests.models.quant_checkpoints import LINEAR_SUFFIXES, _copy_folder, _write
    tensors = _copy_folder(src, dst)
    experts = {}
    for name in list(tensors):
        is_expert = ".experts." in name
        if not (name.endswith(LINEAR_SUFFIXES) or is_expert):
            continue
        w = tensors.pop(name).astype(np.float32)
        scale = (np.abs(w).max(1, keepdims=True) / 448.0).astype(np.float32)
        codes = np.clip(w / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        prefix = name[:-len("weight")]
        tensors[name], tensors[prefix + "weight_scale"] = codes, scale
        if is_expert:
            experts[name] = (codes, scale)
    _write(dst, tensors, {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float",
                                  "dynamic": True, "strategy": "token"}}},
        "ignore": ["lm_head", "re:.*block_sparse_moe.gate$"]})
    return experts


def test_an_fp8_checkpoints_experts_load_as_its_codes_and_scales(
        tiny_model_factory, tmp_path, float_logits):
    from tests.runners import JaxInferRunner
    src = tiny_model_factory("mixtral")
    dst = str(tmp_path / "mixtral-fp8")
    experts = write_fp8_mixtral(src, dst)
    ours = JaxInferRunner(dst, **ENGINE)
    mlp = ours.engine.runner.params["layers_1"]["mlp"]
    for ours_name, hf in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        stored = [experts[f"model.layers.1.block_sparse_moe.experts.{e}.{hf}.weight"]
                  for e in range(4)]
        np.testing.assert_array_equal(
            np.asarray(mlp[ours_name]["weight"]).astype(np.float32),
            np.stack([c.T for c, _ in stored]).astype(np.float32))
        np.testing.assert_array_equal(np.asarray(mlp[ours_name]["weight_scale"]),
                                      np.stack([s[:, 0] for _, s in stored]))
    ids = [ours.tokenizer.encode(p) for p in PROMPTS]
    got = ours.prefill_logits(ids)
    scale = max(float(np.abs(w).max()) for w in float_logits)
    err = max(float(np.abs(g - w).max()) for g, w in zip(got, float_logits))
    assert 0 < err < 0.4 * scale
