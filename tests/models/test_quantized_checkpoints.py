"""AWQ, GPTQ and fp8 checkpoints (written by tests/models/quant_checkpoints.py
from the formats' descriptions): the loaded params dequantize to exactly
the weights the checkpoint encodes, the quantized model computes what a
float model of those weights computes, and bad combinations are typed
errors naming what to change."""

from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxinfer.models import (
    MissingWeightError,
    load_params,
    model_class,
    model_constants,
    resolve_model,
)
from jaxinfer.models.quantization import (
    Fp8UnsupportedDeviceError,
    QuantizationMismatchError,
    UnknownQuantizationError,
    UnsupportedGroupSizeError,
    UnsupportedQuantizationConfigError,
)
from jaxinfer.models.quantization.methods import dequantize_grouped
from jaxinfer.models.quantization.resolve import linear_weights
from tests.models import quant_checkpoints as qc
from tests.models.forward import packed_prefill_logits

FORMATS = {
    "awq": (qc.write_awq, {}),
    "gptq": (qc.write_gptq, {}),
    "gptq-desc-act": (qc.write_gptq, {"desc_act": True}),
    "gptq-v2": (qc.write_gptq, {"v2": True}),
    "gptq-8bit": (qc.write_gptq, {"bits": 8, "desc_act": True}),
    "gptq-quantize-config-file": (qc.write_gptq,
                                  {"config_file": "quantize_config.json"}),
    "fp8-tensor": (qc.write_fp8, {}),
    "fp8-channel-static": (qc.write_fp8, {"per_channel": True,
                                          "static": True}),
}


@pytest.fixture(scope="module")
def float_dir(tiny_model_factory):
    return tiny_model_factory("qwen2")  # q/k/v biases beside quantized weights


@pytest.fixture(scope="module")
def checkpoints(float_dir, tmp_path_factory):
    """name -> (folder, reference dequantized weights by HF name)."""
    out = {}
    for name, (write, kw) in FORMATS.items():
        dst = str(tmp_path_factory.mktemp(name))
        out[name] = (dst, write(float_dir, dst, **kw))
    return out


def _node(params, path):
    for key in path:
        params = params[key]
    return params


def _dequantized(files, params, path):
    """The [*O, In] float32 weights a layer's params hold, in checkpoint
    input order."""
    node = _node(params, path)
    scheme = files.config.quantization.method_for(path)
    if "weight_scale" in node:  # fp8
        scale = np.asarray(node["weight_scale"])
        w = np.asarray(node["weight"]).astype(np.float32)
        return w * (scale[..., None] if scale.ndim else scale)
    w = np.asarray(dequantize_grouped(scheme, node))
    if "perm" in node:  # act order: column j holds input perm[j]
        unsorted = np.empty_like(w)
        unsorted[..., np.asarray(node["perm"])] = w
        w = unsorted
    return w


@pytest.mark.parametrize("name", list(FORMATS))
def test_dequantized_weights_equal_the_numpy_reference(checkpoints, name):
    folder, reference = checkpoints[name]
    files = resolve_model(folder)  # the checkpoint's own quantization_config
    assert files.config.quantization is not None
    params = load_params(files, jnp.float32)
    n = 0
    for path, prefix, layout in linear_weights(files.config):
        want = reference[prefix + "weight"].reshape(*layout.out_shape, -1)
        np.testing.assert_array_equal(_dequantized(files, params, path), want,
                                      err_msg=prefix)
        n += 1
    assert n == 7 * files.config.num_layers


@pytest.mark.slow
@pytest.mark.parametrize("name", ["awq", "gptq-desc-act", "gptq-8bit",
                                  "fp8-channel-static"])
def test_quantized_model_computes_its_float_twins_logits(
        checkpoints, float_dir, tmp_path, name):
    """The step's dequantize-then-dot (and for fp8 the quantized
    activations) against a float model holding the same weights."""
    folder, reference = checkpoints[name]
    twin = str(tmp_path / "twin")
    qc.write_dequantized(float_dir, twin, reference)
    rng = np.random.default_rng(0)
    ids = [list(rng.integers(0, 49152, n)) for n in (40, 17)]
    got, want = [], []
    for src, out in ((folder, got), (twin, want)):
        files = resolve_model(src)
        model = model_class(files.config.architecture)(files.config)
        out.extend(packed_prefill_logits(
            model, load_params(files, jnp.float32),
            model_constants(model, 128), ids, 16, jnp.float32))
    for g, w in zip(got, want):
        if name.startswith("fp8"):
            # W8A8 also rounds the activations to e4m3 (up to 2**-4
            # relative; test_quantize_at_load.py checks that product
            # exactly): a bound relative to the logits.
            assert float(np.abs(g - w).mean()) < 0.1 * float(np.abs(w).mean())
        else:
            assert float(np.abs(g - w).max()) < 1e-4


def test_modules_to_not_convert_stay_float(float_dir, tmp_path):
    dst = str(tmp_path / "awq-skip")
    qc.write_awq(float_dir, dst, skip=("mlp.down_proj",))
    files = resolve_model(dst)
    params = load_params(files, jnp.float32)
    down = params["layers_0"]["mlp"]["down_proj"]
    assert set(down) == {"kernel"}
    assert set(params["layers_0"]["mlp"]["up_proj"]) == {
        "qweight", "scales", "qzeros"}
    hf = load_file(os.path.join(dst, "model.safetensors"))
    np.testing.assert_array_equal(
        np.asarray(down["kernel"]),
        hf["model.layers.0.mlp.down_proj.weight"].T)


# -- which method is served -------------------------------------------------

def test_marlin_aliases_serve_the_same_checkpoints(checkpoints):
    awq = resolve_model(checkpoints["awq"][0], quantization="awq_marlin")
    gptq = resolve_model(checkpoints["gptq"][0], quantization="gptq_marlin")
    assert (awq.config.quantization.method, gptq.config.quantization.method) \
        == ("awq", "gptq")


def test_a_flag_naming_another_method_is_a_mismatch(checkpoints):
    with pytest.raises(QuantizationMismatchError,
                       match=r"quantization='gptq' .* quantized with 'awq'"):
        resolve_model(checkpoints["awq"][0], quantization="gptq")
    with pytest.raises(QuantizationMismatchError, match="'awq'"):
        resolve_model(checkpoints["awq"][0], quantization="int8")


def test_awq_on_a_float_checkpoint_says_how_to_quantize_at_load(float_dir):
    with pytest.raises(QuantizationMismatchError,
                       match="no quantization_config.*'int8' or 'fp8'"):
        resolve_model(float_dir, quantization="awq")


def _with_config(folder, tmp_path, **changes):
    dst = str(tmp_path / "edited")
    shutil.copytree(folder, dst)
    with open(os.path.join(dst, "config.json")) as f:
        hf = json.load(f)
    hf["quantization_config"].update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(hf, f)
    return dst


@pytest.mark.parametrize("group", [48, 12, 0])
def test_a_group_size_the_matmul_does_not_take(checkpoints, tmp_path, group):
    dst = _with_config(checkpoints["awq"][0], tmp_path, group_size=group)
    with pytest.raises(UnsupportedGroupSizeError, match=f"group_size={group}"):
        resolve_model(dst)


@pytest.mark.parametrize("changes, match", [
    ({"bits": 3}, "GPTQ with 3 bits"),
    ({"is_marlin_format": True}, "Marlin"),
    ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
])
def test_gptq_configs_that_are_not_served(checkpoints, tmp_path, changes,
                                          match):
    dst = _with_config(checkpoints["gptq"][0], tmp_path, **changes)
    with pytest.raises(UnsupportedQuantizationConfigError, match=match):
        resolve_model(dst)


def test_awq_gemv_packing_is_not_served(checkpoints, tmp_path):
    dst = _with_config(checkpoints["awq"][0], tmp_path, version="gemv")
    with pytest.raises(UnsupportedQuantizationConfigError, match="gemv"):
        resolve_model(dst)


def test_block_wise_fp8_is_not_served(checkpoints, tmp_path):
    dst = _with_config(checkpoints["awq"][0], tmp_path, quant_method="fp8",
                       weight_block_size=[128, 128])
    with pytest.raises(UnsupportedQuantizationConfigError,
                       match="weight_block_size"):
        resolve_model(dst)


def test_a_checkpoint_of_an_unserved_method(checkpoints, tmp_path):
    dst = _with_config(checkpoints["awq"][0], tmp_path,
                       quant_method="bitsandbytes")
    with pytest.raises(UnknownQuantizationError, match="'bitsandbytes'"):
        resolve_model(dst)


def test_a_missing_quantized_tensor_is_named(checkpoints, tmp_path):
    dst = str(tmp_path / "missing")
    shutil.copytree(checkpoints["awq"][0], dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.o_proj.scales"]
    save_file(tensors, path)
    with pytest.raises(MissingWeightError,
                       match=r"model.layers.1.self_attn.o_proj.scales"):
        load_params(resolve_model(dst), jnp.float32)


def test_fp8_on_a_gpu_without_fp8_tensor_cores(checkpoints, monkeypatch):
    import jax

    class Ampere:
        platform, device_kind, compute_capability = "gpu", "NVIDIA A100", "8.0"

    monkeypatch.setattr(jax, "devices", lambda *a: [Ampere()])
    with pytest.raises(Fp8UnsupportedDeviceError, match="8.9"):
        resolve_model(checkpoints["fp8-tensor"][0])
    # int4 weights need no fp8 tensor cores
    assert resolve_model(checkpoints["awq"][0]).config.quantization


@pytest.mark.slow
def test_dummy_weights_of_a_quantized_config(checkpoints, tmp_path):
    """--load-format dummy with an AWQ config.json (benchmarks of quantized
    shapes): random codes and scales in the quantized layout."""
    from jaxinfer import LLM, SamplingParams
    dst = tmp_path / "config-only"
    dst.mkdir()
    for name in os.listdir(checkpoints["awq"][0]):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(checkpoints["awq"][0], name), dst)
    llm = LLM(str(dst), load_format="dummy", num_gpu_blocks_override=16,
              max_model_len=32)
    up = llm.llm_engine.runner.params["layers_0"]["mlp"]["up_proj"]
    assert up["qweight"].dtype == jnp.uint8 and up["qweight"].shape == (128, 32)
    assert int(jnp.max(up["qzeros"])) <= 15
    out = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def _greedy(folder, **kw):
    from jaxinfer import LLM, SamplingParams
    llm = LLM(folder, dtype="float32", max_model_len=128, max_num_seqs=4,
              max_num_batched_tokens=64, block_size=16, **kw)
    prompts = [{"prompt_token_ids": [5, 17, 300, 41]},
               {"prompt_token_ids": list(range(100, 133))}]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0,
                                                ignore_eos=True))
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.slow
def test_the_engine_runs_awq_layers_on_the_int4_kernel(checkpoints,
                                                       monkeypatch):
    """On one GPU the runner puts 4-bit zero-point layers on the Pallas
    int4 kernel (methods.with_int4_kernel); here the choice is forced on
    CPU, where the kernel runs interpreted. The engine's greedy tokens equal
    XLA's dequantize-then-dot path's, and every such layer took the kernel."""
    import jax

    from jaxinfer.models.quantization import methods as qm
    from jaxinfer.pallas_kernels import int4_matmul as i4
    from jaxinfer.worker import model_runner
    folder = checkpoints["awq"][0]
    xla_llm, want = _greedy(folder)
    assert xla_llm.llm_engine.runner.cfg.quantization.scheme.kernel == "xla"
    calls = []
    real = i4.int4_matmul
    monkeypatch.setattr(i4, "int4_matmul",
                        lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    if jax.default_backend() != "gpu":
        monkeypatch.setattr(model_runner, "with_int4_kernel",
                            lambda cfg, n, platform: qm.with_int4_kernel(
                                cfg, n, "gpu"))
    kernel_llm, got = _greedy(folder, warmup=False)
    assert kernel_llm.llm_engine.runner.cfg.quantization.scheme.kernel \
        == "pallas"
    assert calls  # traced through the kernel, not XLA's product
    assert got == want


def test_int4_layers_of_one_input_share_a_kernel_call(checkpoints,
                                                      monkeypatch):
    """On the int4 kernel, q/k/v and gate/up each reach ``int4_matmul_many``
    as one group (one Mosaic call on Hopper), o and down alone; the tokens
    equal XLA's path's."""
    import jax

    from jaxinfer.models.quantization import methods as qm
    from jaxinfer.pallas_kernels import int4_matmul as i4
    from jaxinfer.worker import model_runner
    folder = checkpoints["awq"][0]
    _, want = _greedy(folder)
    groups = []
    real = i4.int4_matmul_many
    monkeypatch.setattr(i4, "int4_matmul_many", lambda x, sets, **k: (
        groups.append(len(sets)) or real(x, sets, **k)))
    if jax.default_backend() != "gpu":
        monkeypatch.setattr(model_runner, "with_int4_kernel",
                            lambda cfg, n, platform: qm.with_int4_kernel(
                                cfg, n, "gpu"))
    _, got = _greedy(folder, warmup=False)
    assert got == want
    # Traced once per layer pattern and step shape: q/k/v as 3, gate/up 2.
    assert set(groups) == {3, 2}, groups


def test_compute_together_groups_by_input_and_method():
    import jax.numpy as jnp

    from jaxinfer.models.layers import PendingProduct, compute_together
    runs = []

    def run(products):
        runs.append(len(products))
        return [p.weights for p in products]

    def other(products):
        runs.append(-len(products))
        return [p.weights for p in products]
    x, y = jnp.ones(2), jnp.zeros(2)
    got = compute_together(PendingProduct(x, "q", (2,), (1,), run), "array",
                           PendingProduct(x, "k", (2,), (1,), run),
                           PendingProduct(y, "v", (2,), (1,), run),
                           PendingProduct(x, "w", (2,), (1,), other))
    assert got == ["q", "array", "k", "v", "w"]
    assert sorted(runs) == [-1, 1, 2]
