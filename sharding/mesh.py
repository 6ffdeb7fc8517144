"""Device meshes. Axes are ("data", "stage", "model"): tensor parallelism
splits the "model" axis, pipeline parallelism the "stage" axis (layers split
into consecutive groups); "data" stays 1 within an engine (data-parallel
replicas are separate engines on disjoint devices). "model" is innermost so
that a tensor-parallel group is consecutive devices (one host, one NVLink
domain); stages may span hosts."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "stage", "model")


def make_mesh(tensor_parallel_size: int = 1,
              devices: Sequence[jax.Device] | None = None,
              pipeline_parallel_size: int = 1) -> Mesh:
    """A (1, pipeline_parallel_size, tensor_parallel_size) mesh over the
    first devices (default: every device of every process, in JAX's order:
    by process, then local id, so a stage is one host's devices when each
    host holds tensor_parallel_size of them)."""
    devices = list(devices if devices is not None else jax.devices())
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    for name, size in (("tensor_parallel_size", tp),
                       ("pipeline_parallel_size", pp)):
        if size < 1:
            raise ValueError(f"{name} must be >= 1, got {size}")
    if tp * pp > len(devices):
        sizes = f"tensor_parallel_size={tp}" + (
            f" x pipeline_parallel_size={pp}" if pp > 1 else "")
        raise ValueError(
            f"{sizes} needs {tp * pp} devices, but {len(devices)} "
            f"{devices[0].platform} device(s) are visible")
    grid = np.array(devices[:tp * pp]).reshape(1, pp, tp)
    return Mesh(grid, MESH_AXES)


def stage_mesh(mesh: Mesh, stage: int) -> Mesh:
    """The devices of one pipeline stage, as a mesh with the same axes (its
    "stage" axis of size 1), so the same PartitionSpecs apply on it."""
    return Mesh(mesh.devices[:, stage:stage + 1, :], mesh.axis_names)
