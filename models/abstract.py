"""Shapes and logical axes of a model's params, without allocating them."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxinfer.pallas_kernels import kv_cache

from .attention import AttentionMetadata
from .config import ModelConfig


def abstract_variables(model: nn.Module, cfg: ModelConfig,
                       every_layer: bool = False) -> dict[str, Any]:
    """``jax.eval_shape(model.init, ...)`` on a one-token dummy batch: every
    param as a ShapeDtypeStruct, wrapped in ``nn.LogicallyPartitioned`` with
    its logical axis names. (The ``constants`` collection it also holds is
    a placeholder: ``runtime.model_constants`` builds the real one.)

    A model whose layers are all alike (``uniform_layers``, their params
    under ``layers_0`` ... ``layers_{L-1}``) is initialized with one layer
    and that layer's params repeated: the same tree, without tracing L
    layers' initialization at every engine start. ``every_layer`` traces
    all of them anyway (for a caller that intercepts each module's call)."""
    L = cfg.num_layers
    alike = (getattr(type(model), "uniform_layers", False)
             and getattr(model, "layers_alike", lambda: False)())
    if alike and L > 1 and not every_layer:
        one = _abstract_init(model.clone(cfg=dataclasses.replace(cfg, num_layers=1)),
                             dataclasses.replace(cfg, num_layers=1))
        params = dict(one["params"])
        layer = params.pop("layers_0")
        params.update({f"layers_{i}": layer for i in range(L)})
        return {**one, "params": params}
    return _abstract_init(model, cfg)


def _abstract_init(model: nn.Module, cfg: ModelConfig) -> dict[str, Any]:
    block = 16
    pages = kv_cache.init_kv_pages  # shapes only; eval_shape allocates nothing

    def init() -> Any:
        md = AttentionMetadata(
            slot_mapping=jnp.zeros(1, jnp.int32),
            block_tables=jnp.zeros((1, 1), jnp.int32),
            kv_lens=jnp.ones(1, jnp.int32),
            cu_q_lens=jnp.array([0, 1], jnp.int32),
            num_seqs=jnp.ones(1, jnp.int32))
        kv = pages(cfg.num_layers, 2, block, cfg.num_kv_heads, cfg.head_dim,
                   jnp.float32)
        return model.init(jax.random.key(0), jnp.zeros(1, jnp.int32),
                          jnp.zeros(1, jnp.int32), kv, md,
                          jnp.zeros(1, jnp.int32))

    return jax.eval_shape(init)
