"""Device meshes. Axes are ("data", "model"): tensor parallelism splits the
"model" axis; "data" is reserved for data-parallel replicas."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "model")


def make_mesh(tensor_parallel_size: int = 1, devices=None) -> Mesh:
    """A (1, tensor_parallel_size) mesh over the first devices."""
    devices = list(devices if devices is not None else jax.devices())
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got "
                         f"{tensor_parallel_size}")
    if tensor_parallel_size > len(devices):
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} needs that many "
            f"devices, but {len(devices)} {devices[0].platform} device(s) are "
            "visible")
    grid = np.array(devices[:tensor_parallel_size]).reshape(1, tensor_parallel_size)
    return Mesh(grid, MESH_AXES)
