"""Mixture-of-experts GGUF files, each layer's experts stacked under one
tensor name as llama.cpp writes them: Qwen3-MoE (``qwen3moe``) against HF
transformers' own GGUF loading and the HF checkpoint the file was written
from; Mixtral (written as ``llama`` with an expert count, q/k rows
permuted), which HF's GGUF loader does not read, against the checkpoint.

The file is written here with the ``gguf`` package, the tensors named and
laid out as llama.cpp's converter does. HF's GGUF loader does not read the
experts' hidden size from the file (it keeps Qwen3MoeConfig's default,
768), so the tiny model uses that size.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxinfer.models import load_params, resolve_model
from tests.models.gguf_blocks import _copy_embedded_tokenizer, llama_gguf_writer, llama_permute
from tests.runners import HfRunner, JaxInferRunner, check_outputs_equal

PROMPTS = ["Hello, my name is", "The capital of France is",
           "One two three four five six seven eight nine ten " * 4]
MAX_TOKENS = 12
LOGITS_ATOL = 1e-4
MOE_F = 768  # HF's GGUF loader assumes Qwen3MoeConfig's default

LAYER = {"input_layernorm": "attn_norm",
         "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate": "ffn_gate_inp"}
EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
           "down_proj": "ffn_down_exps"}
TOP = {"model.embed_tokens.weight": "token_embd.weight",
       "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def write_qwen3_moe_gguf(hf_dir: str, path: str) -> None:
    import gguf
    with open(os.path.join(hf_dir, "config.json")) as f:
        hp = json.load(f)
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    E = hp.get("num_experts") or hp["num_local_experts"]
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_expert_count(E)
    w.add_expert_used_count(hp["num_experts_per_tok"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_rope_freq_base(hp["rope_parameters"]["rope_theta"])
    w.add_vocab_size(hp["vocab_size"])
    _copy_embedded_tokenizer(w)
    for name, x in sd.items():
        x = x.astype(np.float32)
        if name in TOP:
            w.add_tensor(TOP[name], x)
            continue
        i, rest = name[len("model.layers."):].split(".", 1)
        part = rest.rsplit(".", 1)[0]
        if part in LAYER:
            w.add_tensor(f"blk.{i}.{LAYER[part]}.weight", x)
    add_stacked_experts(w, sd, hp["num_hidden_layers"], E,
                        "model.layers.{i}.mlp.experts.{e}.{proj}.weight", EXPERTS)


def add_stacked_experts(w, sd: dict, layers: int, E: int, hf_name: str,
                        gguf_names: dict) -> None:
    """Each layer's experts of each projection stacked [E, out, in] under
    one tensor, as llama.cpp writes them, then the file finished.
    ``hf_name``: a per-expert tensor's name with {i}, {e} and {proj}."""
    for i in range(layers):
        for proj, gname in gguf_names.items():
            stacked = np.stack([sd[hf_name.format(i=i, e=e, proj=proj)]
                                for e in range(E)]).astype(np.float32)
            w.add_tensor(f"blk.{i}.{gname}.weight", stacked)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def moe_gguf(tiny_model_factory, tmp_path_factory):
    hf_dir = tiny_model_factory("qwen3_moe", moe_intermediate_size=MOE_F,
                                norm_topk_prob=True)
    path = str(tmp_path_factory.mktemp("moe-gguf") / "tiny-qwen3moe.gguf")
    write_qwen3_moe_gguf(hf_dir, path)
    return hf_dir, path


def test_config_and_stacked_experts_from_the_file(moe_gguf):
    hf_dir, path = moe_gguf
    files = resolve_model(path)
    cfg = files.config
    assert (cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok,
            cfg.moe_intermediate_size, cfg.norm_topk_prob, cfg.qk_norm) == (
        "Qwen3MoeForCausalLM", 4, 2, MOE_F, True, True)
    ours = load_params(files, jnp.float32)
    want = load_params(resolve_model(hf_dir), jnp.float32)
    for name in ("router", "gate_proj", "up_proj", "down_proj"):
        np.testing.assert_array_equal(ours["layers_1"]["mlp"][name],
                                      want["layers_1"]["mlp"][name])


def test_greedy_and_logits_equal_hf_gguf_loading(moe_gguf):
    hf_dir, path = moe_gguf
    hf = HfRunner(path)
    ours = JaxInferRunner(path, max_model_len=256, max_num_batched_tokens=32,
                          num_gpu_blocks_override=64)
    check_outputs_equal(hf.generate_greedy(PROMPTS, MAX_TOKENS),
                        ours.generate_greedy(PROMPTS, MAX_TOKENS),
                        "hf (gguf)", "jaxinfer (gguf)")
    ids = [hf.encode(p) for p in PROMPTS]
    assert ids == [ours.tokenizer.encode(p) for p in PROMPTS]
    got = ours.prefill_logits(ids)
    for want in (hf.prefill_logits(ids), HfRunner(hf_dir).prefill_logits(ids)):
        assert max(float(np.abs(g - w).max())
                   for g, w in zip(got, want)) < LOGITS_ATOL


MIXTRAL_LAYER = {"input_layernorm": "attn_norm",
                 "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "block_sparse_moe.gate": "ffn_gate_inp"}
MIXTRAL_EXPERTS = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps",
                   "w2": "ffn_down_exps"}


def write_mixtral_gguf(hf_dir: str, path: str) -> None:
    """As llama.cpp's converter writes Mixtral: a "llama" file with the
    expert counts, q/k rows permuted, the experts stacked."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        hp = json.load(f)
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    E = hp["num_local_experts"]
    w = llama_gguf_writer(path, hp, hp.get("rope_theta", 10000.0))
    w.add_expert_count(E)
    w.add_expert_used_count(hp["num_experts_per_tok"])
    _copy_embedded_tokenizer(w)
    heads = {"self_attn.q_proj": hp["num_attention_heads"],
             "self_attn.k_proj": hp["num_key_value_heads"]}
    for name, x in sd.items():
        x = x.astype(np.float32)
        if name in TOP:
            w.add_tensor(TOP[name], x)
            continue
        i, rest = name[len("model.layers."):].split(".", 1)
        part = rest.rsplit(".", 1)[0]
        if part in heads:
            x = llama_permute(x, heads[part])
        if part in MIXTRAL_LAYER:
            w.add_tensor(f"blk.{i}.{MIXTRAL_LAYER[part]}.weight", x)
    add_stacked_experts(
        w, sd, hp["num_hidden_layers"], E,
        "model.layers.{i}.block_sparse_moe.experts.{e}.{proj}.weight",
        MIXTRAL_EXPERTS)


@pytest.fixture(scope="module")
def mixtral_gguf(tiny_model_factory, tmp_path_factory):
    hf_dir = tiny_model_factory("mixtral")
    path = str(tmp_path_factory.mktemp("mixtral-gguf") / "tiny-mixtral.gguf")
    write_mixtral_gguf(hf_dir, path)
    return hf_dir, path


def test_mixtral_gguf_is_served_as_mixtral_with_its_checkpoints_weights(mixtral_gguf):
    hf_dir, path = mixtral_gguf
    cfg = resolve_model(path).config
    assert (cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok,
            cfg.norm_topk_prob) == ("MixtralForCausalLM", 4, 2, True)
    ours = load_params(resolve_model(path), jnp.float32)
    want = load_params(resolve_model(hf_dir), jnp.float32)
    # q/k come back un-permuted, the stacked experts as the per-expert ones.
    for name in ("q_proj", "k_proj"):
        np.testing.assert_array_equal(ours["layers_1"]["self_attn"][name]["kernel"],
                                      want["layers_1"]["self_attn"][name]["kernel"])
    for name in ("router", "gate_proj", "up_proj", "down_proj"):
        np.testing.assert_array_equal(ours["layers_1"]["mlp"][name],
                                      want["layers_1"]["mlp"][name])


def test_mixtral_gguf_greedy_and_logits_equal_the_hf_checkpoint(mixtral_gguf):
    hf_dir, path = mixtral_gguf
    hf = HfRunner(hf_dir)
    ours = JaxInferRunner(path, max_model_len=256, max_num_batched_tokens=32,
                          num_gpu_blocks_override=64)
    ids = [hf.encode(p) for p in PROMPTS]
    assert ids == [ours.tokenizer.encode(p) for p in PROMPTS]
    check_outputs_equal(hf.generate_greedy(PROMPTS, MAX_TOKENS),
                        ours.generate_greedy(PROMPTS, MAX_TOKENS),
                        "hf (checkpoint)", "jaxinfer (gguf)")
    got = ours.prefill_logits(ids)
    assert max(float(np.abs(g - w).max())
               for g, w in zip(got, hf.prefill_logits(ids))) < LOGITS_ATOL


def test_a_gguf_architecture_without_an_experts_form_is_refused_naming_it(
        tmp_path):
    import gguf

    from jaxinfer.models.errors import CheckpointError
    path = str(tmp_path / "qwen2-experts.gguf")
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_block_count(1)
    w.add_expert_count(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="'qwen2' with experts is not supported"):
        resolve_model(path)
