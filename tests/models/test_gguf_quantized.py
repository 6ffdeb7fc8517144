"""GGUF files served with quantization="gguf": Q8_0 / Q4_0 / Q4_1 / Q4_K /
Q6_K blocks (written by tests/models/gguf_blocks.py from llama.cpp's
layouts) stay quantized on the device and dequantize in the step to the
weights the dequantized path loads, bit for bit."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import load_params, model_class, model_constants, resolve_model
from jaxinfer.models.quantization import QuantizationMismatchError
from jaxinfer.models.quantization.methods import dequantize_grouped
from jaxinfer.models.quantization.resolve import linear_weights
from tests.models.forward import packed_prefill_logits
from tests.models.gguf_blocks import write_quantized_llama_gguf

MIXED = {  # every block type, on inputs of 256 (attention) and 512 (down)
    "model.layers.0.self_attn.q_proj.weight": "Q4_K",
    "model.layers.0.self_attn.k_proj.weight": "Q6_K",
    "model.layers.0.self_attn.v_proj.weight": "Q8_0",
    "model.layers.0.self_attn.o_proj.weight": "Q4_0",
    "model.layers.0.mlp.gate_proj.weight": "Q4_1",
    "model.layers.0.mlp.up_proj.weight": "Q4_K",
    "model.layers.0.mlp.down_proj.weight": "Q6_K",
    "model.layers.1.self_attn.q_proj.weight": "Q8_0",
    "model.layers.1.self_attn.k_proj.weight": "Q4_1",
    "model.layers.1.self_attn.v_proj.weight": "Q4_0",
    "model.layers.1.self_attn.o_proj.weight": "F32",  # stays float
    "model.layers.1.mlp.gate_proj.weight": "Q6_K",
    "model.layers.1.mlp.up_proj.weight": "Q8_0",
    "model.layers.1.mlp.down_proj.weight": "Q4_K",
}


@pytest.fixture(autouse=True)
def _no_weight_cache(monkeypatch):
    monkeypatch.setenv("JAXINFER_WEIGHT_CACHE_DIR", "")


@pytest.fixture(scope="module")
def hf_dir(tiny_model_factory):
    # K-quants need inputs in multiples of 256.
    return tiny_model_factory("llama", hidden_size=256, intermediate_size=512)


@pytest.fixture(scope="module")
def mixed_gguf(hf_dir, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "mixed.gguf")
    decoded = write_quantized_llama_gguf(hf_dir, path, MIXED.get)
    return path, decoded


def _node(params, path):
    for key in path:
        params = params[key]
    return params


def test_kept_blocks_dequantize_to_the_encoded_weights(mixed_gguf):
    path, decoded = mixed_gguf
    files = resolve_model(path, quantization="gguf")
    qc = files.config.quantization
    params = load_params(files, jnp.float32)
    raw = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for lpath, prefix, layout in linear_weights(files.config):
        name = prefix + "weight"
        node = _node(params, lpath)
        if MIXED[name] == "F32":
            assert qc.method_for(lpath) is None and set(node) == {"kernel"}
            continue
        got = np.asarray(dequantize_grouped(qc.method_for(lpath), node))
        want = decoded[name].reshape(*layout.out_shape, -1)
        np.testing.assert_array_equal(got, want, err_msg=name)
        # and what the gguf package's own dequantizer makes of the file
        # (rows still in llama.cpp's permuted q/k order there)
        gname = (f"blk.{lpath[0][len('layers_'):]}."
                 + {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
                    "o_proj": "attn_output", "gate_proj": "ffn_gate",
                    "up_proj": "ffn_up", "down_proj": "ffn_down"}[lpath[-1]]
                 + ".weight")
        t = raw[gname]
        theirs = gguf.quants.dequantize(t.data, t.tensor_type)
        if lpath[-1] not in ("q_proj", "k_proj"):
            np.testing.assert_array_equal(got.reshape(theirs.shape), theirs)


def test_codes_stay_packed_on_the_device(mixed_gguf):
    files = resolve_model(mixed_gguf[0], quantization="gguf")
    params = load_params(files, jnp.float32)
    layer = params["layers_0"]
    q4k = layer["self_attn"]["q_proj"]  # [N, H, In / 2] bytes + f32 scales
    assert q4k["qweight"].dtype == jnp.uint8
    assert q4k["qweight"].shape == (4, 64, 128)
    assert q4k["scales"].shape == (4, 64, 256 // 32)
    q8 = layer["self_attn"]["v_proj"]
    assert q8["qweight"].dtype == jnp.int8 and q8["scales"].dtype == jnp.float16


@pytest.mark.slow
def test_same_logits_as_the_dequantized_path(mixed_gguf):
    path, _ = mixed_gguf
    rng = np.random.default_rng(0)
    ids = [list(rng.integers(0, 49152, n)) for n in (33, 9)]
    out = []
    for q in (None, "gguf"):
        files = resolve_model(path, quantization=q)
        model = model_class(files.config.architecture)(files.config)
        out.append(packed_prefill_logits(
            model, load_params(files, jnp.float32),
            model_constants(model, 64), ids, 16, jnp.float32))
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)


def test_other_methods_on_a_gguf(mixed_gguf, caplog):
    path, _ = mixed_gguf
    with pytest.raises(QuantizationMismatchError, match="'gguf'"):
        resolve_model(path, quantization="awq")
    # int8 / fp8 quantize the dequantized weights at load, and say so: the
    # file's own blocks are dropped.
    with caplog.at_level("WARNING"):
        files = resolve_model(path, quantization="int8")
    assert files.config.quantization.method == "int8"
    assert "re-quantizes the GGUF file's dequantized weights" in caplog.text
    assert "quantization='gguf' keeps them" in caplog.text
    assert files.reader.tensor_type(
        "model.layers.0.self_attn.q_proj.weight") == "Q4_K"


def _kl(p_logits, q_logits) -> float:
    lp = jax.nn.log_softmax(jnp.asarray(p_logits), -1)
    lq = jax.nn.log_softmax(jnp.asarray(q_logits), -1)
    return float(jnp.mean(jnp.sum(jnp.exp(lp) * (lp - lq), -1)))


@pytest.mark.slow
def test_q4_k_stays_within_its_kl_bound(hf_dir, tmp_path):
    """Mean KL(float || Q4_K) over 1,000 positions of the tiny random
    model, whose flat distributions make it a harsh case: about 0.12
    measured; the bound is twice that."""
    path = str(tmp_path / "q4k.gguf")
    write_quantized_llama_gguf(hf_dir, path, lambda name: "Q4_K")
    rng = np.random.default_rng(1)
    ids = [list(rng.integers(0, 49152, 250)) for _ in range(4)]
    logits = []
    for src, q in ((hf_dir, None), (path, "gguf")):
        files = resolve_model(src, quantization=q)
        model = model_class(files.config.architecture)(files.config)
        logits.append(np.concatenate(packed_prefill_logits(
            model, load_params(files, jnp.float32),
            model_constants(model, 256), ids, 16, jnp.float32)))
    assert logits[0].shape[0] == 1000
    assert _kl(*logits) < KL_BOUND_Q4_K


KL_BOUND_Q4_K = 0.25


@pytest.mark.slow
@pytest.mark.xdist_group("hf_embedded")
def test_embedded_gguf_kept_quantized_gives_the_recorded_greedy_tokens(
        tmp_path):
    """The embedded SmolLM2 (Q4_1 projections) with its blocks kept
    quantized: test_hf_parity's prompts and engine settings give the very
    tokens recorded for the dequantized path (golden_tokens.json)."""
    import json
    import pathlib

    from tests.models.test_hf_parity import ENGINE, PROMPTS
    from tests.runners import JaxInferRunner
    golden = json.loads((pathlib.Path(__file__).with_name(
        "golden_tokens.json")).read_text())
    runner = JaxInferRunner("smollm2-135m-instruct", quantization="gguf",
                            compilation_cache_dir=str(tmp_path), **ENGINE)
    q_proj = runner.llm.llm_engine.runner.params["layers_0"]["self_attn"][
        "q_proj"]
    assert q_proj["qweight"].dtype == jnp.uint8  # Q4_1 kept: 4-bit codes
    tokens = [ids for ids, _ in runner.generate_greedy(
        PROMPTS, golden["max_tokens"])]
    assert tokens == golden["tokens"]["embedded"]
