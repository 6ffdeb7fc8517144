"""HF tensor names -> our param pytree, shared by every checkpoint format.

A loader only has to answer ``get(hf_name) -> np.ndarray | None``; this module
knows which tensors the architecture needs, how each is laid out in our params
(HF stores Linear weights as [out, in]; we store [in, out] with heads split),
and checks every shape against the config, so a missing tensor or a wrong
shape is a typed error naming the tensor.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from .config import ModelConfig
from .errors import MissingWeightError, ShapeMismatchError

TensorGetter = Callable[[str], "np.ndarray | None"]


def _linear(out_shape, in_shape):
    """HF Linear [out, in] -> kernel in_shape + out_shape."""
    def convert(w):
        return np.asarray(w).T.reshape(*in_shape, *out_shape)
    return convert


def weight_specs(cfg: ModelConfig):
    """Yields (hf_name, param_path, hf_shape, convert) for every tensor."""
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    same = np.asarray
    yield "model.embed_tokens.weight", ("embedding",), (V, D), same
    for i in range(cfg.num_layers):
        hf, p = f"model.layers.{i}.", (f"layers_{i}",)
        attn = p + ("self_attn",)
        yield hf + "input_layernorm.weight", p + ("input_layernorm", "scale"), (D,), same
        yield (hf + "post_attention_layernorm.weight",
               p + ("post_attention_layernorm", "scale"), (D,), same)
        for name, heads in (("q_proj", N), ("k_proj", K), ("v_proj", K)):
            yield (hf + f"self_attn.{name}.weight", attn + (name, "kernel"),
                   (heads * H, D), _linear((heads, H), (D,)))
            if cfg.attention_bias:
                yield (hf + f"self_attn.{name}.bias", attn + (name, "bias"),
                       (heads * H,), lambda b, h=heads: np.asarray(b).reshape(h, H))
        yield (hf + "self_attn.o_proj.weight", attn + ("o_proj", "kernel"),
               (D, N * H), _linear((D,), (N, H)))
        if cfg.qk_norm:
            yield hf + "self_attn.q_norm.weight", attn + ("q_norm", "scale"), (H,), same
            yield hf + "self_attn.k_norm.weight", attn + ("k_norm", "scale"), (H,), same
        mlp = p + ("mlp",)
        for name, out_dim, in_dim in (("gate_proj", F, D), ("up_proj", F, D),
                                      ("down_proj", D, F)):
            yield (hf + f"mlp.{name}.weight", mlp + (name, "kernel"),
                   (out_dim, in_dim), _linear((out_dim,), (in_dim,)))
            if cfg.mlp_bias:
                yield hf + f"mlp.{name}.bias", mlp + (name, "bias"), (out_dim,), same
    yield "model.norm.weight", ("norm", "scale"), (D,), same
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", ("lm_head",), (V, D), lambda w: np.asarray(w).T


def build_params(cfg: ModelConfig, get: TensorGetter, dtype, source: str,
                 place: Callable | None = None) -> dict:
    """Fetches, checks, converts and places every tensor, one at a time (so
    peak host memory is one tensor, not the checkpoint).

    ``place(path, array)`` puts a converted array on device (e.g. into its
    final sharding); by default ``jnp.asarray``.
    """
    params: dict = {}
    for hf_name, path, shape, convert in weight_specs(cfg):
        w = get(hf_name)
        if w is None:
            raise MissingWeightError(
                f"{source}: tensor {hf_name!r} is missing (needed by "
                f"{cfg.architecture} with this config)")
        if tuple(w.shape) != tuple(shape):
            raise ShapeMismatchError(
                f"{source}: tensor {hf_name!r} has shape {tuple(w.shape)}, "
                f"but the config implies {tuple(shape)}")
        arr = convert(w)
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = (place(path, arr, dtype) if place else
                          jnp.asarray(arr, dtype=dtype))
    return params
