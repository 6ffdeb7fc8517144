"""Mixture-of-experts checkpoints that ship 4-bit experts (AutoAWQ, AutoGPTQ;
written by tests/models/quant_checkpoints.py): each expert's codes load as
the weights they encode, and the model computes what a float model of those
weights computes, on ragged_dot and on the grouped-matmul kernel
(interpreted), alone and split over two devices."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import resolve_model
from jaxinfer.models.moe import grouped_experts, route
from jaxinfer.models.moe_weights import expert_floats
from jaxinfer.models.quantization.config import QuantizationConfig
from jaxinfer.models.quantization.errors import UnsupportedQuantizationConfigError
from jaxinfer.models.quantization.methods import GroupedWeights
from jaxinfer.pallas_kernels.grouped_matmul import Int4Weights
from tests.models import quant_checkpoints as qc
from tests.runners import JaxInferRunner, check_outputs_equal

PROMPTS = ["Hello, my name is", "The capital of France is",
           "One two three four five six seven eight nine ten " * 3]
ENGINE = dict(num_gpu_blocks_override=64, max_model_len=256,
              max_num_batched_tokens=64, dtype="float32",
              enable_prefix_caching=True)
MAX_TOKENS = 12

# id -> (tiny_models arch, config overrides, writer, its arguments, experts
# implementation). The kernel case has eight experts and 64-input groups, so
# no layer traced for ragged_dot is reused for it.
CASES = {
    "mixtral-awq": ("mixtral", {}, qc.write_awq,
                    {"suffixes": qc.LINEAR_SUFFIXES + qc.MIXTRAL_EXPERT_SUFFIXES},
                    None),
    "qwen3-moe-gptq": ("qwen3_moe", {}, qc.write_gptq, {}, None),
    "mixtral-awq-kernel": ("mixtral", {"num_local_experts": 8}, qc.write_awq,
                           {"group": 64, "suffixes": qc.LINEAR_SUFFIXES
                            + qc.MIXTRAL_EXPERT_SUFFIXES}, "pallas_interpret"),
}
# Our param name -> Mixtral's and Qwen3-MoE's per-expert HF names.
HF_EXPERT_NAMES = {
    "mixtral": {"gate_proj": "block_sparse_moe.experts.{e}.w1",
                "up_proj": "block_sparse_moe.experts.{e}.w3",
                "down_proj": "block_sparse_moe.experts.{e}.w2"},
    "qwen3_moe": {"gate_proj": "mlp.experts.{e}.gate_proj",
                  "up_proj": "mlp.experts.{e}.up_proj",
                  "down_proj": "mlp.experts.{e}.down_proj"},
}


def _random_int4(key, E, K, N, group):
    ks = jax.random.split(key, 3)
    G = K // group
    return Int4Weights(
        jax.random.randint(ks[0], (E, K // 2, N), 0, 256).astype(jnp.uint8),
        jax.random.uniform(ks[1], (E, G, N), minval=0.005, maxval=0.02
                           ).astype(jnp.float16),
        jax.random.randint(ks[2], (E, G, N), 0, 16).astype(jnp.uint8))


@pytest.mark.parametrize("impl", ["ragged_dot", "pallas_interpret"])
def test_int4_experts_multiply_as_their_dequantized_weights(impl):
    ks = jax.random.split(jax.random.key(7), 5)
    T, D, F, E, k = 9, 64, 96, 4, 2
    x = jax.random.normal(ks[0], (T, D))
    w, ids = route(jax.random.normal(ks[1], (T, E)), k, True)
    gate, up = (_random_int4(kk, E, D, F, 32) for kk in ks[2:4])
    down = _random_int4(ks[4], E, F, D, 32)
    got = grouped_experts(x, w, ids, gate, up, down, jax.nn.silu, impl=impl)
    want = grouped_experts(x, w, ids, *(expert_floats(q, jnp.float32)
                                        for q in (gate, up, down)),
                           jax.nn.silu, impl="ragged_dot")
    scale = float(jnp.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("scheme,match", [
    (GroupedWeights(bits=8, group_size=32, zeros=True), "4-bit AWQ or GPTQ"),
    (GroupedWeights(bits=4, group_size=32, zeros=True, act_order=True),
     "without desc_act"),
    (GroupedWeights(bits=4, group_size=16, zeros=True), "multiple of 32"),
])
def test_int4_experts_it_cannot_serve_are_refused_naming_what_runs(
        tiny_model_factory, scheme, match):
    cfg = resolve_model(tiny_model_factory("mixtral")).config
    with pytest.raises(UnsupportedQuantizationConfigError, match=match):
        dataclasses.replace(cfg, quantization=QuantizationConfig(
            "gptq", "gptq", scheme))


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tiny_model_factory, tmp_path_factory):
    """(arch, quantized folder, float folder of the weights it encodes,
    reference weights by HF name, experts implementation)."""
    arch, overrides, write, kw, impl = CASES[request.param]
    src = tiny_model_factory(arch, **overrides)
    dst = str(tmp_path_factory.mktemp(request.param))
    reference = write(src, dst, **kw)
    assert any(".experts." in name for name in reference)
    floats = str(tmp_path_factory.mktemp(request.param + "-dequantized"))
    qc.write_dequantized(src, floats, reference)
    return arch, dst, floats, reference, impl


@pytest.fixture(scope="module")
def engines(checkpoint):
    from jaxinfer.models import moe
    arch, dst, floats, reference, impl = checkpoint
    old, moe.EXPERTS_IMPL = moe.EXPERTS_IMPL, impl
    try:
        yield JaxInferRunner(dst, **ENGINE), JaxInferRunner(floats, **ENGINE)
    finally:
        moe.EXPERTS_IMPL = old


def test_experts_load_as_the_weights_their_codes_encode(checkpoint, engines):
    arch, _, _, reference, _ = checkpoint
    ours, _ = engines
    assert ours.engine.model_config.quantization.method in ("awq", "gptq")
    for layer in (0, 1):
        mlp = ours.engine.runner.params[f"layers_{layer}"]["mlp"]
        for name, pattern in HF_EXPERT_NAMES[arch].items():
            node = mlp[name]
            assert node["qweight"].dtype == jnp.uint8
            got = np.asarray(expert_floats(Int4Weights(
                node["qweight"], node["scales"], node["qzeros"]), jnp.float32))
            E = got.shape[0]
            want = np.stack([reference[f"model.layers.{layer}."
                                       + pattern.format(e=e) + ".weight"].T
                             for e in range(E)])
            np.testing.assert_array_equal(got, want)


def test_greedy_tokens_and_logits_equal_the_dequantized_model(engines):
    ours, floats = engines
    ids = [ours.tokenizer.encode(p) for p in PROMPTS]
    got, want = ours.prefill_logits(ids), floats.prefill_logits(ids)
    scale = max(float(np.abs(w).max()) for w in want)
    assert max(float(np.abs(g - w).max()) for g, w in zip(got, want)) < 1e-4 * scale
    want_tokens = floats.generate_greedy(PROMPTS, MAX_TOKENS)
    check_outputs_equal(want_tokens, ours.generate_greedy(PROMPTS, MAX_TOKENS),
                        "dequantized float", "int4 experts")
    hits = ours.engine.get_stats().prefix_cache_hits
    check_outputs_equal(want_tokens, ours.generate_greedy(PROMPTS, MAX_TOKENS),
                        "dequantized float", "int4 experts (prefix cached)")
    assert ours.engine.get_stats().prefix_cache_hits > hits


_TP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import LLM, SamplingParams
    path, engine = sys.argv[1], json.loads(sys.argv[2])
    prompts = json.loads(sys.argv[3])
    sp = SamplingParams(max_tokens=12, temperature=0)
    out = {}
    for tp in (1, 2):
        llm = LLM(path, tensor_parallel_size=tp, **engine)
        outs = llm.generate(prompts, sp, use_tqdm=False)
        mlp = llm.llm_engine.runner.params["layers_0"]["mlp"]["down_proj"]
        out[tp] = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                   "specs": [list(map(str, mlp[n].sharding.spec))
                             for n in ("qweight", "scales", "qzeros")]}
        del llm
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
def test_int4_experts_split_over_two_devices_give_one_devices_tokens(
        tiny_model_factory, tmp_path):
    dst = str(tmp_path / "mixtral-awq")
    qc.write_awq(tiny_model_factory("mixtral"), dst,
                 suffixes=qc.LINEAR_SUFFIXES + qc.MIXTRAL_EXPERT_SUFFIXES)
    engine = {k: v for k, v in ENGINE.items() if k != "enable_prefix_caching"}
    proc = subprocess.run(
        [sys.executable, "-c", _TP_SCRIPT, dst, json.dumps(engine),
         json.dumps(PROMPTS)], capture_output=True, text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    assert out["2"]["tokens"] == out["1"]["tokens"]
    # Four experts over two devices: split by expert, codes, scales and
    # zeros alike.
    assert all(spec[0] == "model" for spec in out["2"]["specs"])
