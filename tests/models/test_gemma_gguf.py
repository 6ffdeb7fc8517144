"""Gemma 2 and Gemma 3 GGUF files as llama.cpp writes them (norm weights
stored as 1 + w, soft caps and window in the metadata), on files these
tests write with the ``gguf`` package from tiny HF checkpoints: the
engine's logits equal those of the HF checkpoint and of HF transformers'
own GGUF loading of the same file. The file's vocabulary is the tiny models' byte-level BPE
(a real Gemma GGUF holds a SentencePiece one, which the engine hands to
HF's GGUF tokenizer)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxinfer.models import load_params, model_class, model_constants, resolve_model
from jaxinfer.models.gemma import FULL, GGUF_LAYER_NAMES, GGUF_TOP_NAMES, SLIDING
from tests.models.forward import packed_prefill_logits
from tests.models.gguf_blocks import _copy_embedded_tokenizer
from tests.runners import HfRunner
from tests.tiny_models import make_tiny_model

LOGITS_ATOL = 1e-4
# Gemma 2's released shapes attend with query_pre_attn_scalar = head_dim
# and the default caps (50, 30): what llama.cpp and HF's GGUF loader both
# assume, so a file of this shape means the same to both.
GEMMA2 = dict(head_dim=256, query_pre_attn_scalar=256,
              attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
# Gemma 3 in a shape both sides read alike: llama.cpp and HF's GGUF loader
# agree on a sliding-layer RoPE base of 10000, one global layer in six
# (six layers: the last is global) and no RoPE scaling, and the file has
# no key for query_pre_attn_scalar (llama.cpp: head_dim; HF: 256). The
# global base differs from the sliding one, so swapping them shows.
GEMMA3 = dict(head_dim=256, query_pre_attn_scalar=256, num_hidden_layers=6,
              layer_types=None,
              rope_parameters={
                  "sliding_attention": {"rope_type": "default",
                                        "rope_theta": 10000.0},
                  "full_attention": {"rope_type": "default",
                                     "rope_theta": 1000000.0}})


def _global_rope_theta(hp: dict) -> float:
    """The global layers' RoPE base: Gemma 3 configs keep one
    rope_parameters dict per layer type, Gemma 2's a single one."""
    params = hp["rope_parameters"]
    return float(params.get(FULL, params)["rope_theta"])


def write_gemma_gguf(hf_dir: str, path: str, gguf_arch: str) -> None:
    """What llama.cpp's converter writes for a Gemma 2 / Gemma 3 folder
    (norms stored as 1 + w); only fields the format has a key for."""
    import gguf
    with open(os.path.join(hf_dir, "config.json")) as f:
        hp = json.load(f)
    if gguf_arch == "gemma3":
        # llama.cpp fixes the sliding layers' RoPE base and the layer
        # pattern instead of reading them, and has no key for RoPE scaling:
        # a checkpoint that differs would mean something else as a file.
        local = hp["rope_parameters"][SLIDING]
        assert local["rope_theta"] == 10000.0, local
        assert hp["rope_parameters"][FULL]["rope_type"] == "default"
        assert hp["layer_types"] == [
            FULL if (i + 1) % 6 == 0 else SLIDING
            for i in range(hp["num_hidden_layers"])], hp["layer_types"]
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    w = gguf.GGUFWriter(path, gguf_arch)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_rope_freq_base(_global_rope_theta(hp))
    w.add_sliding_window(hp["sliding_window"])
    if hp.get("attn_logit_softcapping") is not None:
        w.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
    if hp.get("final_logit_softcapping") is not None:
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_vocab_size(hp["vocab_size"])
    _copy_embedded_tokenizer(w)
    top = {v: k for k, v in GGUF_TOP_NAMES.items()}
    layer = {v: k for k, v in GGUF_LAYER_NAMES.items()}
    for name, x in sd.items():
        x = np.asarray(x, np.float32)
        if name.endswith("norm.weight"):
            x = x + 1.0  # llama.cpp's Gemma convention
        if name in top:
            w.add_tensor(top[name], x)
            continue
        i, rest = name[len("model.layers."):].split(".", 1)
        part, kind = rest.rsplit(".", 1)
        w.add_tensor(f"blk.{i}.{layer[part]}.{kind}", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gemma2_gguf(tiny_model_factory, tmp_path_factory):
    hf_dir = tiny_model_factory("gemma2", **GEMMA2)
    path = str(tmp_path_factory.mktemp("gemma-gguf") / "tiny-gemma2.gguf")
    write_gemma_gguf(hf_dir, path, "gemma2")
    return hf_dir, path


@pytest.fixture(scope="module")
def gemma3_gguf(tmp_path_factory):
    # Built directly: the factory's cache key cannot hold the
    # rope_parameters dict.
    hf_dir = make_tiny_model(str(tmp_path_factory.mktemp("tiny-gemma3")),
                             "gemma3", **GEMMA3)
    path = str(tmp_path_factory.mktemp("gemma-gguf") / "tiny-gemma3.gguf")
    write_gemma_gguf(hf_dir, path, "gemma3")
    return hf_dir, path


def _hf_gguf_logits(path, ids):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path),
        dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        return [model(torch.tensor([i])).logits[0].numpy() for i in ids]


def _check_engine_logits(hf_dir, path, architecture):
    """The file's config and norms as the engine reads them, then its
    prefill logits against the HF checkpoint's and HF's GGUF loading's
    (a prompt longer than the window, and a short one). Returns the
    engine's config for the caller's own checks."""
    files = resolve_model(path)
    cfg = files.config
    assert cfg.architecture == architecture
    assert cfg.tie_word_embeddings
    params = load_params(files, np.float32)
    # The stored 1 + w came back as w (the tiny model's norms are random).
    want_norm = load_file(os.path.join(hf_dir, "model.safetensors"))[
        "model.norm.weight"]
    np.testing.assert_allclose(np.asarray(params["norm"]["scale"]), want_norm,
                               atol=1e-6)
    model = model_class(cfg.architecture)(cfg)
    hf = HfRunner(hf_dir)
    text = ("The river starts high in the mountains, where snow melts every "
            "spring and runs down through pine forests into a valley.")
    ids = [hf.encode(text), hf.encode("Hello, my name is")]
    assert len(ids[0]) > cfg.sliding_window
    # The tokenizer the engine builds from the GGUF's metadata gives the
    # same ids.
    from jaxinfer.tokenizer import load_tokenizer
    assert load_tokenizer(files.tokenizer).encode(text) == ids[0]
    got = packed_prefill_logits(model, params, model_constants(model, 256),
                                ids, 16, np.float32)
    for want in (hf.prefill_logits(ids), _hf_gguf_logits(path, ids)):
        assert max(float(np.abs(a - b).max())
                   for a, b in zip(got, want)) < LOGITS_ATOL
    return cfg


def test_gemma2_gguf_equals_hf_checkpoint_and_hf_gguf_loading(gemma2_gguf):
    cfg = _check_engine_logits(*gemma2_gguf, "Gemma2ForCausalLM")
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap) == (50.0, 30.0)
    assert cfg.sliding_window == 8 and cfg.query_pre_attn_scalar == 256


def test_gemma3_gguf_equals_hf_checkpoint_and_hf_gguf_loading(gemma3_gguf):
    cfg = _check_engine_logits(*gemma3_gguf, "Gemma3ForCausalLM")
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap) == (None, None)
    assert cfg.sliding_window == 8 and cfg.query_pre_attn_scalar == 256
    assert cfg.qk_norm
    assert cfg.layer_types[:6] == ("sliding_attention",) * 5 + (
        "full_attention",)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1000000.0, 10000.0)
