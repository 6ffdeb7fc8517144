"""EAGLE heads: the checkpoint's every tensor mapped (none ignored, none
missing), and what cannot be served refused at start with a typed error."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxinfer.errors import InvalidConfigError, UnsupportedFeatureError
from jaxinfer.models import resolve_model
from jaxinfer.models.eagle import eagle_config, read_head_weights
from jaxinfer.models.errors import CheckpointError, MissingWeightError
from jaxinfer.spec_decode.eagle import read_eagle_config


@pytest.fixture(scope="module")
def target_cfg(eagle_target):
    return resolve_model(eagle_target).config


def _edited(head: str, tmp_path, tensors=None, config=None) -> str:
    """A copy of ``head`` with ``tensors`` (name -> array, None: removed)
    and ``config`` (key -> value) changed."""
    out = str(tmp_path / "head")
    shutil.copytree(head, out)
    file = os.path.join(out, "model.safetensors")
    w = load_file(file)
    for name, value in (tensors or {}).items():
        if value is None:
            w.pop(name)
        else:
            w[name] = value
    save_file(w, file)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(config or {})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    return out


def _load(head: str, target_cfg, method: str = "eagle") -> dict:
    ec = read_eagle_config(method, head, target_cfg)
    w = load_file(os.path.join(head, "model.safetensors"))
    got = {}
    read_head_weights(ec, w.get, set(w), head,
                      lambda path, array, dtype: got.__setitem__(path, array))
    return got


def test_an_eagle1_checkpoint_maps_every_tensor(eagle_heads, target_cfg):
    head = eagle_heads["eagle"]
    got = _load(head, target_cfg)
    names = set(load_file(os.path.join(head, "model.safetensors")))
    assert "layers.0.input_layernorm.weight" not in names
    assert len(got) == len(names)  # one param per tensor, none left out
    D = target_cfg.hidden_size
    assert got[("fc",)].shape == (2 * D, D)
    assert ("layer", "self_attn", "q_proj", "kernel") in got


def test_an_eagle3_checkpoint_maps_every_tensor(eagle_heads, target_cfg):
    head = eagle_heads["eagle3"]
    got = _load(head, target_cfg, "eagle3")
    names = set(load_file(os.path.join(head, "model.safetensors")))
    assert "t2d" in names  # present, not needed to draft
    assert len(got) == len(names) - 1
    D, V = target_cfg.hidden_size, target_cfg.vocab_size
    Vd = V // 2  # the test head's draft vocabulary
    assert got[("fc",)].shape == (3 * D, D)
    assert got[("lm_head",)].shape == (D, Vd)
    assert got[("d2t",)].dtype == np.int32 and got[("d2t",)].shape == (Vd,)
    kernel = got[("layer", "self_attn", "q_proj", "kernel")]
    assert kernel.shape[0] == 2 * D  # q/k/v read embeddings and features
    assert ("layer", "hidden_norm", "scale") in got


def test_an_unknown_or_missing_tensor_is_an_error(eagle_heads, target_cfg,
                                                  tmp_path):
    head = eagle_heads["eagle"]
    D = target_cfg.hidden_size
    extra = _edited(head, tmp_path / "a", {
        "layers.0.input_layernorm.weight": np.ones(D, np.float32)})
    with pytest.raises(CheckpointError, match="input_layernorm"):
        _load(extra, target_cfg)
    missing = _edited(head, tmp_path / "b",
                      {"layers.0.mlp.up_proj.weight": None})
    with pytest.raises(MissingWeightError, match="up_proj"):
        _load(missing, target_cfg)


def test_fc_bias_and_own_embeddings_are_read_when_present(eagle_heads,
                                                          target_cfg,
                                                          tmp_path):
    D, V = target_cfg.hidden_size, target_cfg.vocab_size
    head = _edited(eagle_heads["eagle"], tmp_path, {
        "fc.bias": np.zeros(D, np.float32),
        "embed_tokens.weight": np.zeros((V, D), np.float32)})
    got = _load(head, target_cfg)
    assert got[("fc_bias",)].shape == (D,)
    assert got[("embedding",)].shape == (V, D)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_head_for_another_target_is_refused(eagle_heads, target_cfg,
                                              tmp_path, method):
    head = eagle_heads[method]
    wide = _edited(head, tmp_path / "a", config={"hidden_size": 128})
    with pytest.raises(InvalidConfigError, match="hidden_size 128"):
        read_eagle_config(method, wide, target_cfg)
    vocab = _edited(head, tmp_path / "b", config={"vocab_size": 512})
    with pytest.raises(InvalidConfigError, match="vocab_size 512"):
        read_eagle_config(method, vocab, target_cfg)
    gemma = dataclasses.replace(target_cfg, architecture="Gemma2ForCausalLM")
    with pytest.raises(UnsupportedFeatureError, match="Gemma2ForCausalLM"):
        read_eagle_config(method, head, gemma)
    quantized = _edited(head, tmp_path / "c",
                        config={"quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(UnsupportedFeatureError, match="quantized"):
        read_eagle_config(method, quantized, target_cfg)


def test_a_head_without_safetensors_is_refused(eagle_heads, target_cfg,
                                               tmp_path):
    out = tmp_path / "bin"
    out.mkdir()
    shutil.copy(os.path.join(eagle_heads["eagle"], "config.json"), out)
    (out / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(UnsupportedFeatureError, match="pytorch_model.bin"):
        read_eagle_config("eagle", str(out), target_cfg)


def test_eagle3_aux_layers_default_to_vllms_and_must_exist():
    hf = dict(vocab_size=100, hidden_size=8, intermediate_size=16,
              num_hidden_layers=1, num_attention_heads=2)
    assert eagle_config("eagle3", hf, set(), 32).taps == (2, 16, 29)
    with pytest.raises(ValueError, match="three layer ids"):
        eagle_config("eagle3", hf, set(), 2)
    with pytest.raises(ValueError, match="use_aux_hidden_state"):
        eagle_config("eagle3", dict(hf, eagle_config={
            "use_aux_hidden_state": False}), set(), 32)
    with pytest.raises(ValueError, match="target_hidden_size"):
        eagle_config("eagle3", dict(hf, target_hidden_size=16), set(), 32)


@pytest.mark.slow
def test_an_eagle_head_beside_tensor_parallelism_is_refused(
        make_llm, eagle_target, eagle_heads):
    import jax
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    with pytest.raises(UnsupportedFeatureError, match="tensor or pipeline"):
        make_llm(eagle_target, tensor_parallel_size=2, speculative_config={
            "method": "eagle", "model": eagle_heads["eagle"],
            "num_speculative_tokens": 2})
