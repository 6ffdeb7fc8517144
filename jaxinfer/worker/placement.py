"""Where arrays live: the mesh, each param's sharding, the KV pool's.

Params are streamed from the checkpoint one tensor at a time straight into
their final sharding (no full copy on one device); the KV pool is created
already sharded on kv heads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models.abstract import abstract_variables
from jaxinfer.pallas_kernels import kv_pages_shape
from jaxinfer.pallas_kernels.kv_cache import page_scales_shape
from jaxinfer.sharding import (kv_pages_sharding, make_mesh, param_shardings,
                               replicated)


class Placement:
    def __init__(self, model, cfg, tensor_parallel_size: int = 1):
        self.cfg = cfg
        self.mesh = make_mesh(tensor_parallel_size)
        if tensor_parallel_size > 1 and cfg.num_heads % tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size={tensor_parallel_size} must divide the "
                f"number of attention heads ({cfg.num_heads})")
        self.param_shardings = param_shardings(
            abstract_variables(model, cfg)["params"], self.mesh)
        self.kv_sharding = kv_pages_sharding(cfg.num_kv_heads, self.mesh)
        self.replicated = replicated(self.mesh)

    @property
    def kv_shards(self) -> int:
        """How many ways each page is split across devices."""
        spec = self.kv_sharding.spec
        return self.mesh.shape["model"] if spec and spec[0] == "model" else 1

    def place_param(self, path, array, dtype) -> jax.Array:
        node = self.param_shardings
        for key in path:
            node = node[key]
        host = np.asarray(array).astype(jnp.dtype(dtype), copy=False)
        return jax.device_put(host, node)

    def zeros_kv(self, num_layers: int, num_pages: int, block_size: int, dtype):
        """Per layer (k_pages, v_pages), and for one-byte (fp8) pages their
        per-page scales too: (k, v, k_scales, v_scales)."""
        shape = kv_pages_shape(num_pages, block_size, self.cfg.num_kv_heads,
                               self.cfg.head_dim)
        make = jax.jit(lambda: jnp.zeros(shape, dtype),
                       out_shardings=self.kv_sharding)
        if jnp.dtype(dtype).itemsize != 1:
            return [(make(), make()) for _ in range(num_layers)]
        scales = jax.jit(lambda: jnp.zeros(
            page_scales_shape(num_pages, self.cfg.num_kv_heads), jnp.float32),
            out_shardings=self.kv_sharding)
        return [(make(), make(), scales(), scales()) for _ in range(num_layers)]
