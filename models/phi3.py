"""Phi-3 (``Phi3ForCausalLM``): the Llama decoder with fused checkpoint
tensors and LongRoPE.

The module is ``LlamaForCausalLM``; what differs is the checkpoint and the
config. Phi-3 stores q, k and v as one ``qkv_proj`` and gate and up as one
``gate_up_proj``; each is cut into our separate layers at load time, so
that tensor parallelism splits q, k and v (and gate and up) each on its
own heads, as it does for Llama, and the fused output axis never straddles
a shard. With ``fused_qkv`` the q/k/v rows are regrouped by kv head into
the one weight of ``fused_qkv.py`` instead. Its ``longrope`` scaling
(``su`` and ``yarn`` are older names HF maps to it for this family) is
computed in ``rope.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .config import ModelConfig, decoder_config_from_hf
from .errors import ModelConfigError
from .fused_qkv import qkv_specs
from .llama import LlamaForCausalLM
from .spec import ModelSpec, WeightSpec, linear_from_hf


def _rows(start: int, stop: int, convert: Callable[[Any], np.ndarray]
          ) -> Callable[[Any], np.ndarray]:
    """The conversion of rows ``start:stop`` of a fused HF Linear weight."""
    def cut(w: Any) -> np.ndarray:
        return convert(np.asarray(w)[start:stop])
    return cut


def phi3_weights(cfg: ModelConfig) -> Iterator[WeightSpec]:
    D, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    yield WeightSpec("model.embed_tokens.weight", ("embedding",), (V, D))
    for i in range(cfg.num_layers):
        hf, p = f"model.layers.{i}.", (f"layers_{i}",)
        yield WeightSpec(hf + "input_layernorm.weight",
                         p + ("input_layernorm", "scale"), (D,))
        yield WeightSpec(hf + "post_attention_layernorm.weight",
                         p + ("post_attention_layernorm", "scale"), (D,))
        if cfg.fused_qkv:  # regrouped by kv head (fused_qkv.py)
            yield from qkv_specs(cfg, hf + "self_attn.", p + ("self_attn",),
                                 stored="qkv_proj.weight")
        else:
            start = 0
            for name, heads in (("q_proj", N), ("k_proj", K), ("v_proj", K)):
                yield WeightSpec(
                    hf + "self_attn.qkv_proj.weight",
                    p + ("self_attn", name, "kernel"), ((N + 2 * K) * H, D),
                    _rows(start, start + heads * H,
                          linear_from_hf((heads, H), (D,))))
                start += heads * H
        yield WeightSpec(hf + "self_attn.o_proj.weight",
                         p + ("self_attn", "o_proj", "kernel"), (D, N * H),
                         linear_from_hf((D,), (N, H)))
        # HF chunks gate_up's output in two: gate first, then up.
        for j, name in enumerate(("gate_proj", "up_proj")):
            yield WeightSpec(hf + "mlp.gate_up_proj.weight",
                             p + ("mlp", name, "kernel"), (2 * F, D),
                             _rows(j * F, (j + 1) * F, linear_from_hf((F,), (D,))))
        yield WeightSpec(hf + "mlp.down_proj.weight",
                         p + ("mlp", "down_proj", "kernel"), (D, F),
                         linear_from_hf((D,), (F,)))
    yield WeightSpec("model.norm.weight", ("norm", "scale"), (D,))
    if not cfg.tie_word_embeddings:
        yield WeightSpec("lm_head.weight", ("lm_head",), (V, D),
                         lambda w: np.asarray(w).T)


def count_params(cfg: ModelConfig) -> int:
    """Each checkpoint tensor once (a fused one feeds several layers)."""
    shapes = {w.hf_name: w.hf_shape for w in phi3_weights(cfg)}
    return sum(math.prod(s) for s in shapes.values())


def _rope_params(hf: dict) -> dict:
    """HF's rope dict (either name), with Phi-3's older type names mapped
    to longrope and the scaling factor HF derives when none is given."""
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = dict(hf.get(key) or {})
    kind = rope.get("rope_type", rope.get("type"))
    if kind in ("su", "yarn", "longrope"):
        rope.pop("type", None)
        rope["rope_type"] = "longrope"
        orig = rope.get("original_max_position_embeddings") or hf.get(
            "original_max_position_embeddings")
        if orig is None:
            raise ModelConfigError(
                "Phi-3 longrope needs original_max_position_embeddings")
        rope["original_max_position_embeddings"] = int(orig)
        if rope.get("factor") is None:
            rope["factor"] = (int(hf.get("max_position_embeddings", 4096))
                              / int(orig))
    partial = float(rope.pop("partial_rotary_factor", None)
                    or hf.get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        raise ModelConfigError(
            f"partial_rotary_factor={partial} is not supported: RoPE rotates "
            "the whole head (Phi-3 checkpoints with a factor of 1.0 load)")
    return {**hf, key: rope}


def config_from_hf(hf: dict) -> ModelConfig:
    return decoder_config_from_hf(_rope_params(hf), "Phi3ForCausalLM")


SPECS = (
    ModelSpec(architecture="Phi3ForCausalLM", model=LlamaForCausalLM,
              config_from_hf=config_from_hf, weights=phi3_weights,
              count_params=count_params, fuses_qkv=True),
)
