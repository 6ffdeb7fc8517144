"""Tiny random-weight HF checkpoints built from configs, for fast tests.

Each is saved as a real HF folder (config.json, safetensors, tokenizer) so it
goes through the same loaders as a user's checkpoint. The tokenizer is the
embedded SmolLM2's (vocab 49152), so text round-trips like a real model's.
"""

from __future__ import annotations

import functools
import os

import torch

VOCAB = 49152

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

ROPE_SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0,
             "original_max_position_embeddings": 128},
}


@functools.lru_cache(maxsize=1)
def embedded_tokenizer():
    from jaxinfer.models import resolve_model
    from jaxinfer.tokenizer import load_tokenizer
    return load_tokenizer(resolve_model("smollm2-135m-instruct").tokenizer)


def hf_config(arch: str = "llama", rope: str = "default", **overrides):
    """An HF config object for one of the supported architectures."""
    from transformers import (LlamaConfig, MistralConfig, Qwen2Config,
                              Qwen3Config)
    kw = dict(BASE)
    if arch == "llama":
        cls = LlamaConfig
        if ROPE_SCALINGS[rope] is not None:
            kw["rope_scaling"] = dict(ROPE_SCALINGS[rope], rope_theta=10000.0)
    elif arch == "mistral":
        cls = MistralConfig
        kw["sliding_window"] = 8  # shorter than the test prompts
    elif arch == "qwen2":
        cls = Qwen2Config
    elif arch == "qwen3":
        cls = Qwen3Config
        kw["head_dim"] = 32
    else:
        raise ValueError(arch)
    kw.update(overrides)
    return cls(**kw)


def make_tiny_model(path: str, arch: str = "llama", rope: str = "default",
                    seed: int = 0, max_shard_size: str | None = None,
                    **overrides) -> str:
    """Saves a random-weight model (float32) and the tokenizer under path."""
    from transformers import AutoModelForCausalLM
    cfg = hf_config(arch, rope, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Larger-than-default init so that random models have peaked, decisive
    # distributions (greedy ties would make parity tests flaky).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    os.makedirs(path, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    embedded_tokenizer().save_pretrained(path)
    return path
