"""Random weights made on device: vLLM's ``--load-format dummy``.

For benchmarks of real model shapes (e.g. llama3-8b) without a checkpoint:
each param is drawn directly on its devices, in its final sharding, so
nothing of model size passes through host memory.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from .abstract import abstract_variables
from .config import ModelConfig
from .quantization.methods import PARAM_NAMES


def random_params(model: nn.Module, cfg: ModelConfig,
                  dtype: jax.typing.DTypeLike, shardings: Any = None,
                  seed: int = 0, std: float = 0.02) -> dict:
    """Normal(0, std) matrices, unit norm scales, zero biases. Each
    param's draw depends on ``seed`` and its name alone, so two models
    whose params share a name and shape share its value: a config with
    fewer layers gives the first layers, embeddings and head of the
    longer one (a draft model for speculative decoding's benchmarks). A
    model with one q/k/v weight (``fused_qkv.py``) gets the separate
    model's q, k and v joined, so both forms hold the same weights (and a
    draft or an EAGLE head built from the separate form matches a fused
    target)."""
    abstract = nn.unbox(abstract_variables(model, cfg)["params"])
    if cfg.fused_qkv:
        from .fused_qkv import fuse_params, separate_shardings
        separate = dataclasses.replace(cfg, fused_qkv=False)
        params = random_params(
            model.clone(cfg=separate), separate, dtype,
            None if shardings is None else separate_shardings(shardings),
            seed, std)
        return fuse_params(params, shardings if shardings is not None else
                           jax.tree_util.tree_map(lambda _: None, abstract))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    shard_leaves = (jax.tree_util.tree_leaves(shardings) if shardings is not None
                    else [None] * len(leaves))
    out = []
    makers: dict = {}  # one compiled initializer per (kind, shape, sharding)
    for (path, leaf), sharding in zip(leaves, shard_leaves):
        name = jax.tree_util.keystr(path)
        last = getattr(path[-1], "key", None)
        if last in _QUANTIZED:  # codes and scales in their own dtypes
            kind, leaf_dtype = "q_" + last, leaf.dtype
        else:
            kind = ("ones" if name.endswith("['scale']") else
                    "zeros" if name.endswith("['bias']") else "normal")
            leaf_dtype = dtype
        key = (kind, leaf.shape, str(leaf_dtype), sharding)
        if key not in makers:
            makers[key] = _initializer(kind, leaf.shape, leaf_dtype, std,
                                       sharding)
        draw = zlib.crc32(f"{seed}:{name}".encode())
        out.append(makers[key](jax.random.key(draw)))
    return jax.tree_util.tree_unflatten(treedef, out)


# Quantized layers' params (quantization/methods.py): random codes, scales
# that give weights of about ``std``.
_QUANTIZED = PARAM_NAMES


def _quantized_value(kind: str, k: jax.Array, shape: tuple[int, ...],
                     dtype: jax.typing.DTypeLike, std: float) -> jax.Array:
    if kind in ("q_qweight", "q_weight") and jnp.issubdtype(dtype, jnp.integer):
        return jax.random.bits(k, shape, jnp.uint8).astype(dtype)
    if kind == "q_weight":  # fp8 codes of about unit size
        return jax.random.normal(k, shape, jnp.float32).astype(dtype)
    if kind == "q_qzeros":
        return jnp.full(shape, 8, dtype) + (0 * jax.random.bits(
            k, shape, jnp.uint8)).astype(dtype)
    if kind == "q_perm":
        return jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    noise = jax.random.normal(k, shape, jnp.float32)
    # int8 codes reach 127, fp8 ones about 1: a compromise for both.
    base = {"q_scales": std / 8, "q_weight_scale": std / 16,
            "q_input_scale": 0.05,
            "q_offsets": 0.0}[kind]
    return (base * (1.0 + 0.1 * jnp.abs(noise))).astype(dtype)


def _initializer(kind: str, shape: tuple[int, ...],
                 dtype: jax.typing.DTypeLike, std: float,
                 sharding: Any) -> Callable[[jax.Array], jax.Array]:
    def fn(k: jax.Array) -> jax.Array:
        if kind.startswith("q_"):
            return _quantized_value(kind, k, shape, dtype, std)
        noise = jax.random.normal(k, shape, jnp.float32)
        if kind in ("ones", "zeros"):
            # Computed from the key like the matrices rather than a constant
            # output, which XLA may serve from the executable's constants; a
            # suspect for the misaligned-input error of the llama3-8b engine
            # run with the Mosaic GPU kernels (models/attention.py).
            base = 1.0 if kind == "ones" else 0.0
            return (base + 0.0 * noise).astype(dtype)
        return (noise * std).astype(dtype)
    return jax.jit(fn, out_shardings=sharding) if sharding is not None else jax.jit(fn)
