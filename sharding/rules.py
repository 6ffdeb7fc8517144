"""Partition rules: logical axis names (declared by the model's layers) ->
mesh axes. The single table that decides how a model is split.

Column-parallel q/k/v/gate/up and row-parallel o/down follow from splitting
``heads``/``kv_heads``/``mlp`` on "model"; embedding and lm_head are
vocab-parallel. An axis whose size the model axis does not divide is
replicated instead (e.g. kv heads fewer than devices), which stays correct
and costs memory, never a crash. XLA (GSPMD) inserts the collectives.
"""

from __future__ import annotations

import jax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LOGICAL_RULES = (
    ("vocab", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("mlp", "model"),
    ("embed", None),
    ("head_dim", None),
    ("norm", None),
    ("patch", None),  # a vision tower's patch pixels and positions
)
_RULES = dict(LOGICAL_RULES)


def _spec_for(names, shape, mesh: Mesh) -> PartitionSpec:
    axes = []
    for name, dim in zip(names, shape):
        mesh_axis = _RULES.get(name)
        if mesh_axis is not None and dim % mesh.shape[mesh_axis]:
            mesh_axis = None  # not divisible: replicate this axis
        axes.append(mesh_axis)
    return PartitionSpec(*axes)


def param_shardings(abstract_variables, mesh: Mesh):
    """NamedShardings for every param, from the logically-partitioned
    abstract variables of ``jax.eval_shape(model.init, ...)``."""
    def one(leaf):
        if isinstance(leaf, nn.LogicallyPartitioned):
            return NamedSharding(mesh, _spec_for(leaf.names, leaf.value.shape, mesh))
        return NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(
        one, abstract_variables,
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def kv_pages_sharding(num_kv_heads: int, mesh: Mesh) -> NamedSharding:
    """Pages [K, num_pages, B, H] split on kv heads (replicated when the kv
    heads are fewer than, or not divisible by, the model axis)."""
    return NamedSharding(mesh, _spec_for(("kv_heads",), (num_kv_heads,), mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
