"""Random weights made on device: vLLM's ``--load-format dummy``.

For benchmarks of real model shapes (e.g. llama3-8b) without a checkpoint:
each param is drawn directly on its devices, in its final sharding, so
nothing of model size passes through host memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from .abstract import abstract_variables
from .config import ModelConfig


def random_params(model, cfg: ModelConfig, dtype, shardings=None, seed: int = 0,
                  std: float = 0.02) -> dict:
    """Normal(0, std) matrices, unit norm scales, zero biases."""
    abstract = nn.unbox(abstract_variables(model, cfg)["params"])
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    shard_leaves = (jax.tree_util.tree_leaves(shardings) if shardings is not None
                    else [None] * len(leaves))
    out = []
    makers: dict = {}  # one compiled initializer per (kind, shape, sharding)
    for i, ((path, leaf), sharding) in enumerate(zip(leaves, shard_leaves)):
        name = jax.tree_util.keystr(path)
        kind = ("ones" if name.endswith("['scale']") else
                "zeros" if name.endswith("['bias']") else "normal")
        key = (kind, leaf.shape, sharding)
        if key not in makers:
            makers[key] = _initializer(kind, leaf.shape, dtype, std, sharding)
        out.append(makers[key](jax.random.key(seed * 100003 + i)))
    return jax.tree_util.tree_unflatten(treedef, out)


def _initializer(kind, shape, dtype, std, sharding):
    def fn(k):
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
