"""Meshes and partition rules (``jaxinfer.sharding``)."""

from .mesh import MESH_AXES, make_mesh
from .rules import (LOGICAL_RULES, kv_pages_sharding, param_shardings,
                    replicated)

__all__ = ["MESH_AXES", "make_mesh", "LOGICAL_RULES", "kv_pages_sharding",
           "param_shardings", "replicated"]
