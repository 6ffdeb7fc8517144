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


def _gemma2():
    from transformers import Gemma2Config
    # A window shorter than the test prompts, an attention scale that is
    # not head_dim ** -0.5, and caps low enough to change the results.
    return Gemma2Config, dict(head_dim=16, sliding_window=8,
                              query_pre_attn_scalar=24,
                              attn_logit_softcapping=2.0,
                              final_logit_softcapping=8.0,
                              tie_word_embeddings=True)


def _gemma3():
    from transformers import Gemma3TextConfig
    # Sliding layers on their own RoPE base; the global one linearly scaled.
    return Gemma3TextConfig, dict(
        head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
        num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention",
                     "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0,
                               "rope_theta": 10000.0}},
        tie_word_embeddings=True)


def _phi3():
    from transformers import Phi3Config
    # LongRoPE whose short set (served up to original_max_position_embeddings)
    # and long set differ from each other and from plain RoPE, with an
    # attention factor (max_position_embeddings is twice the original). No
    # window: RoPE then acts over whole prompts (a window takes Llama's
    # path, which the Mistral case checks).
    half = 8  # head_dim 16 / 2
    return Phi3Config, dict(
        max_position_embeddings=1024, original_max_position_embeddings=512,
        rope_scaling={"type": "longrope",
                      "short_factor": [2.0 + 0.5 * i for i in range(half)],
                      "long_factor": [6.0 + 2.0 * i for i in range(half)]})


# Families beyond the Llama variants: arch -> () -> (config class, fields).
FAMILY_CONFIGS = {"gemma2": _gemma2, "gemma3": _gemma3, "phi3": _phi3}


@functools.lru_cache(maxsize=1)
def embedded_tokenizer():
    from jaxinfer.models import resolve_model
    from jaxinfer.tokenizer import load_tokenizer
    return load_tokenizer(resolve_model("smollm2-135m-instruct").tokenizer)


def hf_config(arch: str = "llama", rope: str = "default", **overrides):
    """An HF config object for one of the supported architectures."""
    from transformers import (
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )
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
    elif arch == "mixtral":
        cls = MixtralConfig
        kw.update(num_local_experts=4, num_experts_per_tok=2)
    elif arch == "qwen3_moe":
        cls = Qwen3MoeConfig
        kw.update(head_dim=32, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=64)
    elif arch in FAMILY_CONFIGS:
        cls, extra = FAMILY_CONFIGS[arch]()
        kw.update(extra)
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
            elif arch in FAMILY_CONFIGS and "norm" in name:
                # Norm weights off their init, so a wrong convention
                # (w or 1 + w) shows.
                p.normal_(0.0, 0.2)
    os.makedirs(path, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    embedded_tokenizer().save_pretrained(path)
    return path


def make_draft(target: str, path: str, num_layers: int | None = None,
               noise: float = 0.0, seed: int = 0) -> str:
    """A draft model for ``target`` (a folder make_tiny_model wrote): its
    first ``num_layers`` decoder layers (default: all), embeddings, final
    norm and head, each matrix plus Normal(0, ``noise``) noise, with the
    same tokenizer. The fewer layers and the more noise, the less often
    it agrees with the target."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    if num_layers is not None:
        cfg["num_hidden_layers"] = num_layers
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = np.random.default_rng(seed)
    keep = {}
    for name, t in load_file(os.path.join(target, "model.safetensors")).items():
        if (name.startswith("model.layers.")
                and int(name.split(".")[2]) >= cfg["num_hidden_layers"]):
            continue
        if noise and t.ndim > 1:
            t = (t + rng.normal(0.0, noise, t.shape)).astype(t.dtype)
        keep[name] = t
    save_file(keep, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    embedded_tokenizer().save_pretrained(path)
    return path


# make_eagle_target's embedding rows have this RMS, and its first input
# norm this weight: that norm's output is then the embedding itself.
EAGLE_EMBED_RMS = 0.02
EAGLE_INPUT_NORM = (EAGLE_EMBED_RMS ** 2 + BASE["rms_norm_eps"]) ** 0.5


def make_eagle(target: str, path: str, method: str = "eagle",
               noise: float = 0.0, seed: int = 0,
               draft_vocab: int | None = None) -> str:
    """An EAGLE head for ``target`` (a folder `make_eagle_target` wrote) in
    the real checkpoint layout (vLLM's names: EAGLE-1 ``fc`` and
    ``layers.0`` without input_layernorm; EAGLE-3 ``midlayer``, ``fc`` over
    three taps, ``norm``, its own ``lm_head`` over a draft vocabulary with
    ``d2t``, ``t2d``), its config the target's with one layer.

    Either head computes the target's first layer at the next token (which
    decides the target's tokens), so it drafts well; ``noise`` (a Normal's
    scale) on its matrices (fc's aside) lowers the agreement:

    - EAGLE-1: fc passes the next token's embedding through (the target's
      first input norm leaves it as it is) to a copy of that layer.
    - EAGLE-3: the residual entering the layer is the feature
      (``norm_before_residual``: hidden_norm's output, whose weight 1e-3
      keeps it small), not the embedding; so the head's attention has
      eight heads of 16 (MHA): four are the target's (its k/v heads
      repeated), and four copy the token's own embedding into the
      residual (q = k = the normed embedding times 8: each attends to
      itself alone; v and o_proj identities). fc is random (every tap
      flows through it), and q/k/v read only the embeddings. The taps are
      layers (0, 1, 1) of the two-layer target. ``draft_vocab`` None: the
      target's vocabulary (d2t all zeros); else that many target ids
      drawn at random, in order (d2t their offsets)."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = 1
    V, D = cfg["vocab_size"], cfg["hidden_size"]
    w = load_file(os.path.join(target, "model.safetensors"))
    rng = np.random.default_rng(seed)
    layer = {k[len("model.layers.0."):]: v for k, v in w.items()
             if k.startswith("model.layers.0.")}
    out = {}
    if method == "eagle":
        cfg["architectures"] = ["LlamaForCausalLM"]
        out.update(eagle1_tensors(layer))
    else:
        N, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        H = D // N
        cfg.update(architectures=["LlamaForCausalLMEagle3"],
                   num_attention_heads=2 * N, num_key_value_heads=2 * N,
                   head_dim=H, eagle_aux_hidden_state_layer_ids=[0, 1, 1],
                   norm_before_residual=True,
                   draft_vocab_size=draft_vocab or V)
        out.update(eagle3_midlayer(layer, N, K, H, EAGLE_INPUT_NORM, 1e-3))
        out["fc.weight"] = rng.normal(0.0, 0.08, (D, 3 * D)).astype(np.float32)
        out["norm.weight"] = w["model.norm.weight"]
        ids = (np.arange(V) if draft_vocab is None
               else np.sort(rng.choice(V, draft_vocab, replace=False)))
        out["lm_head.weight"] = w["lm_head.weight"][ids]
        out["d2t"] = (ids - np.arange(len(ids))).astype(np.int64)
        t2d = np.zeros(V, np.bool_)
        t2d[ids] = True
        out["t2d"] = t2d
    for k_, v_ in out.items():
        if noise and v_.ndim > 1 and k_ != "fc.weight":
            out[k_] = (v_ + rng.normal(0.0, noise, v_.shape)).astype(v_.dtype)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(out, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    return path


def eagle1_tensors(layer: dict) -> dict:
    """`make_eagle`'s EAGLE-1 tensors from the target's first layer
    (``layer``: its tensors without ``model.layers.0.``): fc passes the
    token's embedding through, to a copy of that layer without its input
    norm."""
    import numpy as np
    D = layer["self_attn.q_proj.weight"].shape[1]
    eye = np.eye(D, dtype=np.float32)
    out = {"fc.weight": np.concatenate([eye, 0 * eye], axis=1)}
    for name, value in layer.items():
        if name != "input_layernorm.weight":
            out["layers.0." + name] = value
    return out


def eagle3_midlayer(layer: dict, N: int, K: int, H: int, input_norm: float,
                    hidden_norm: float) -> dict:
    """`make_eagle`'s EAGLE-3 ``midlayer.*`` tensors from the target's
    first layer (``layer``: its tensors without ``model.layers.0.``; N
    query and K kv heads of H): 2N heads of MHA, N the target's (its kv
    heads repeated per query head) and N copying the token's embedding
    into the residual (q = k = the embedding, normed by ``input_norm``,
    times 8: each attends to itself alone; v and o_proj identities);
    q/k/v read the embeddings' half of their 2D input only;
    ``hidden_norm`` the feature's norm weight."""
    import numpy as np
    attn = {n: layer[f"self_attn.{n}_proj.weight"] for n in "qkvo"}
    D = attn["q"].shape[1]
    eye = np.eye(D, dtype=np.float32)
    k, v = (np.repeat(attn[n].reshape(K, H, D), N // K, 0).reshape(-1, D)
            for n in "kv")
    copy = eye * 8.0 / input_norm
    out = {}
    for n, rows in (("q", [attn["q"], copy]), ("k", [k, copy]),
                    ("v", [v, eye])):
        rows = np.concatenate(rows, axis=0)  # [2 N H, D]: embeds half
        out[f"midlayer.self_attn.{n}_proj.weight"] = np.concatenate(
            [rows, np.zeros_like(rows)], axis=1)
    out["midlayer.self_attn.o_proj.weight"] = np.concatenate(
        [attn["o"], eye], axis=1)
    for name, value in layer.items():
        if not name.startswith("self_attn."):
            out["midlayer." + name] = value
    out["midlayer.hidden_norm.weight"] = np.full(D, hidden_norm, np.float32)
    return out


def make_eagle_target(path: str, seed: int = 0) -> str:
    """A tiny Llama that an EAGLE head of `make_eagle` drafts for well: its
    first layer decides its tokens (the second's output projections scaled
    by 0.01), and its embedding rows have RMS ``EAGLE_EMBED_RMS`` and its
    first input norm weight ``EAGLE_INPUT_NORM``, so that norm gives the
    embeddings back: a head that reads them without a norm sees what the
    target's first layer sees."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    make_tiny_model(path, seed=seed)
    file = os.path.join(path, "model.safetensors")
    w = load_file(file)
    e = w["model.embed_tokens.weight"]
    w["model.embed_tokens.weight"] = (e * EAGLE_EMBED_RMS / np.sqrt(
        (e * e).mean(-1, keepdims=True))).astype(e.dtype)
    w["model.layers.0.input_layernorm.weight"] = np.full_like(
        w["model.layers.0.input_layernorm.weight"], EAGLE_INPUT_NORM)
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        w[f"model.layers.1.{name}.weight"] *= 0.01
    save_file(w, file, metadata={"format": "pt"})
    return path
