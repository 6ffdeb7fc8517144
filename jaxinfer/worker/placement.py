"""Where arrays live: the mesh, each param's sharding, the KV pool's.

Params are streamed from the checkpoint one tensor at a time straight into
their final sharding (no full copy on one device); the KV pool is created
already sharded on kv heads. With pipeline stages, each layer is first
placed on its stage's devices and ``finish_params`` regroups the layers
into slot arrays sharded on "stage" (``jaxinfer.sharding.pipeline``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxinfer.models.abstract import abstract_variables
from jaxinfer.pallas_kernels import kv_pages_shape
from jaxinfer.pallas_kernels.kv_cache import page_scales_shape
from jaxinfer.sharding import kv_pages_sharding, make_mesh, param_shardings, pipeline, replicated

from ..errors import InvalidConfigError


class Placement:
    def __init__(self, model, cfg, tensor_parallel_size: int = 1,
                 pipeline_parallel_size: int = 1, devices=None):
        self.cfg = cfg
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        if tp > 1 and cfg.num_heads % tp:
            raise InvalidConfigError(
                f"tensor_parallel_size={tp} must divide the "
                f"number of attention heads ({cfg.num_heads})")
        if cfg.num_layers % pp:
            raise InvalidConfigError(
                f"pipeline_parallel_size={pp} must divide the number of "
                f"layers ({cfg.num_layers})")
        try:
            self.mesh = make_mesh(tp, devices, pp)
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None
        self.pipeline_stages = pp
        abstract = abstract_variables(model, cfg)["params"]
        self._abstract = nn.unbox(abstract)
        if pp > 1:
            if not hasattr(model, "decoder_layer"):
                raise InvalidConfigError(
                    f"pipeline_parallel_size={pp}: {cfg.architecture} does "
                    "not declare its pipeline stages (layer_inputs, "
                    "decoder_layer, head); use tensor_parallel_size")
            self.param_shardings = pipeline.load_shardings(abstract, self.mesh)
            self.kv_sharding = pipeline.kv_slot_sharding(cfg.num_kv_heads,
                                                         self.mesh)
        else:
            self.param_shardings = param_shardings(abstract, self.mesh)
            self.kv_sharding = kv_pages_sharding(cfg.num_kv_heads, self.mesh)
        self.replicated = replicated(self.mesh)

    @property
    def kv_shards(self) -> int:
        """How many devices one page (all layers, all kv heads) is split
        over: by kv heads on "model", by layers on "stage"."""
        spec = tuple(self.kv_sharding.spec)
        if self.pipeline_stages > 1:  # [pp, K, ...]: "stage" comes first
            spec = spec[1:]
        heads = self.mesh.shape["model"] if spec and spec[0] == "model" else 1
        return heads * self.pipeline_stages

    def place_param(self, path, array, dtype) -> jax.Array:
        node: Any = self.param_shardings  # walked down to a leaf
        for key in path:
            node = node[key]
        host = np.asarray(array).astype(jnp.dtype(dtype), copy=False)
        return jax.device_put(host, node)

    def elsewhere(self, path):
        """A stand-in for a param held by no device of this process (a
        pipeline stage on another host), so its tensor is never read;
        None for a param this process holds."""
        node: Any = self.param_shardings  # walked down to a leaf
        for key in path:
            node = node[key]
        if node.addressable_devices:
            return None
        shape = self._abstract
        for key in path:
            shape = shape[key]
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=node)

    def finish_params(self, params):
        """Loaded params -> the layout the step takes (slot arrays under
        pipeline stages; as loaded otherwise)."""
        if self.pipeline_stages == 1:
            return params
        return pipeline.stack_slots(params, self.mesh)

    def step_model(self, model):
        """What the step applies: the model, or its pipelined form."""
        if self.pipeline_stages == 1:
            return model
        return pipeline.PipelinedModel(model, self.mesh)

    def _kv_layout(self, num_layers: int, num_pages: int, block_size: int,
                   dtype):
        """(page array shape, scale array shape or None, arrays of each
        kind): what `zeros_kv` allocates."""
        shape: tuple[int, ...] = kv_pages_shape(
            num_pages, block_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        pairs = num_layers
        if self.pipeline_stages > 1:  # one [pp, ...] pair per slot
            shape = (self.pipeline_stages, *shape)
            pairs = num_layers // self.pipeline_stages
        if jnp.dtype(dtype).itemsize != 1:
            return shape, None, pairs
        if self.pipeline_stages > 1:
            raise InvalidConfigError(
                "kv_cache_dtype fp8 with pipeline_parallel_size > 1: the "
                "per-page scales are not laid out by stage yet; use "
                "kv_cache_dtype='auto' with pipeline stages")
        return shape, page_scales_shape(num_pages, self.cfg.num_kv_heads), pairs

    def zeros_kv(self, num_layers: int, num_pages: int, block_size: int, dtype):
        """Per layer (k_pages, v_pages), and for one-byte (fp8) pages their
        per-page scales too: (k, v, k_scales, v_scales)."""
        shape, scales_shape, pairs = self._kv_layout(num_layers, num_pages,
                                                     block_size, dtype)
        make = jax.jit(lambda: jnp.zeros(shape, dtype),
                       out_shardings=self.kv_sharding)
        if scales_shape is None:
            return [(make(), make()) for _ in range(pairs)]
        scales = jax.jit(lambda: jnp.zeros(scales_shape, jnp.float32),
                         out_shardings=self.kv_sharding)
        return [(make(), make(), scales(), scales()) for _ in range(pairs)]

    def kv_structs(self, num_layers: int, num_pages: int, block_size: int,
                   dtype):
        """`zeros_kv`'s arrays as ShapeDtypeStructs (nothing allocated)."""
        shape, scales_shape, pairs = self._kv_layout(num_layers, num_pages,
                                                     block_size, dtype)
        page = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype),
                                    sharding=self.kv_sharding)
        if scales_shape is None:
            return [(page, page) for _ in range(pairs)]
        scale = jax.ShapeDtypeStruct(scales_shape, jnp.float32,
                                     sharding=self.kv_sharding)
        return [(page, page, scale, scale) for _ in range(pairs)]

    def param_structs(self, dtype):
        """The params as the loader places them, as ShapeDtypeStructs in
        their shardings: floating params in ``dtype`` (`place_param`
        casts them), the others as the model declares them. A guess for
        programs built before the weights arrive: the caller compares it
        with what was loaded."""
        def one(a, sharding):
            dt = (jnp.dtype(dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                  else a.dtype)
            return jax.ShapeDtypeStruct(a.shape, dt, sharding=sharding)
        return jax.tree.map(one, self._abstract, self.param_shardings)
