"""Partition rules: logical axis names (declared by the model's layers) ->
mesh axes. The single table that decides how a model is split.

Column-parallel q/k/v/gate/up and row-parallel o/down follow from splitting
``heads``/``kv_heads``/``mlp`` on "model"; embedding and lm_head are
vocab-parallel. An axis whose size the model axis does not divide is
replicated instead (e.g. kv heads fewer than devices), which stays correct
and costs memory, never a crash. XLA (GSPMD) inserts the collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LOGICAL_RULES = (
    ("vocab", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("mlp", "model"),
    # A mixture of experts' stacked weights [E, ...]: split by expert when
    # the model axis divides E (expert parallelism); otherwise the model
    # axis goes to each expert's "mlp" axis (tensor-parallel experts).
    ("experts", "model"),
    ("router", None),  # the router's expert logits: small, replicated
    ("embed", None),
    ("head_dim", None),
    # A fused q/k/v weight's axis inside one kv head's group (its query
    # heads, its k, its v): whole groups go with their kv head.
    ("qkv_group", None),
    ("norm", None),
    ("patch", None),  # a vision tower's patch pixels and positions
)
_RULES = dict(LOGICAL_RULES)


def logical_spec(names: Sequence[str | None], shape: Sequence[int],
                 mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of an array with these logical axis names: each
    name's mesh axis, unless it does not divide the dimension or an
    earlier axis of the array already took it (then replicated)."""
    axes: list[str | None] = []
    for name, dim in zip(names, shape):
        mesh_axis = None if name is None else _RULES.get(name)
        if mesh_axis is not None and (dim % mesh.shape[mesh_axis]
                                      or mesh_axis in axes):
            mesh_axis = None
        axes.append(mesh_axis)
    return PartitionSpec(*axes)


def param_shardings(abstract_variables: Any, mesh: Mesh) -> Any:
    """NamedShardings for every param, from the logically-partitioned
    abstract variables of ``jax.eval_shape(model.init, ...)``."""
    def one(leaf: Any) -> NamedSharding:
        if isinstance(leaf, nn.LogicallyPartitioned):
            return NamedSharding(mesh, logical_spec(leaf.names, leaf.value.shape, mesh))
        return NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(
        one, abstract_variables,
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def kv_pages_sharding(num_kv_heads: int, mesh: Mesh) -> NamedSharding:
    """Pages [K, num_pages, B, H] split on kv heads (replicated when the kv
    heads are fewer than, or not divisible by, the model axis)."""
    return NamedSharding(mesh, logical_spec(("kv_heads",), (num_kv_heads,), mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
