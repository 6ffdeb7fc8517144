"""Meshes and partition rules (``jaxinfer.sharding``)."""

# One module identity per file: this folder is the package ``jaxinfer.sharding``
# (reached through the ``jaxinfer/sharding`` link). Imported as a top-level
# ``sharding`` (from the repo root, say) every class would exist twice and
# ``except`` clauses would miss half the errors, so that name is refused.
if __name__ != "jaxinfer.sharding":
    raise ImportError(f"import jaxinfer.sharding, not {__name__}: the folder "
                      "sharding/ is installed as jaxinfer.sharding")

from .mesh import MESH_AXES, make_mesh
from .rules import LOGICAL_RULES, kv_pages_sharding, param_shardings, replicated

__all__ = ["MESH_AXES", "make_mesh", "LOGICAL_RULES", "kv_pages_sharding",
           "param_shardings", "replicated"]
