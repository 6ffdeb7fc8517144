"""`LoRAPool`: the device-resident adapter slots the jitted step reads.

Per target layer an A and a B array with a slot axis (``models/lora.py``
gives the layout and the logical axes), nested by the layer's scope path
like the params, and sharded by the same rules as the base weights. The
pool has a fixed shape, so the step compiles once whatever adapters it
holds. Writing an adapter into a slot is one host->device copy of its
flat buffer (`SlotLayout`) and one jitted in-place update (the pool is
donated), queued on the device stream before the step that reads it.

On a GPU the host copies of adapters live in pinned (page-locked) host
memory (`stage`), so that copy is one DMA at the link's full rate;
from pageable NumPy memory it is staged through a bounce buffer and a
slot load stalls the step loop for more than a decode step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec

from jaxinfer.models.lora import LORA_A, LORA_B
from jaxinfer.sharding import param_shardings

from .layout import SlotLayout
from .peft_format import LoRAAdapter


def _nest(items) -> dict:
    """{path tuple: leaf} -> nested dicts."""
    out: dict = {}
    for path, leaf in items:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return out


def _leaf(tree: dict, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


class LoRAPool:
    def __init__(self, layout: SlotLayout, num_slots: int, dtype, mesh):
        self.layout = layout
        self.num_slots = num_slots
        self.dtype = dtype
        r = layout.rank
        abstract = _nest(
            (t.path + (name,), nn.LogicallyPartitioned(
                jax.ShapeDtypeStruct(shape, dtype), axes))
            for t in layout.targets.values()
            for name, shape, axes in (
                (LORA_A, t.a_shape(num_slots, r), t.a_axes),
                (LORA_B, t.b_shape(num_slots, r), t.b_axes)))
        self.shardings = param_shardings(abstract, mesh)
        shapes = jax.tree_util.tree_map(
            lambda leaf: leaf.value, abstract,
            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
        self.arrays = jax.jit(
            lambda: jax.tree_util.tree_map(
                lambda s: jnp.zeros(s.shape, s.dtype), shapes),
            out_shardings=self.shardings)()
        self._flat_sharding = NamedSharding(mesh, PartitionSpec())
        self._staging = None  # where `stage` keeps host copies (None: NumPy)
        device = mesh.devices.flat[0]
        if device.platform != "cpu" and any(
                m.kind == "pinned_host" for m in device.addressable_memories()):
            self._staging = self._flat_sharding.with_memory_kind("pinned_host")
        self._write = jax.jit(self._write_slot, donate_argnums=0,
                              out_shardings=self.shardings)

    @property
    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize
                   for x in jax.tree_util.tree_leaves(self.arrays))

    def _write_slot(self, pool, index, flat):
        """Slot ``index`` (0-based) of every layer <- its part of ``flat``."""
        out = []
        for span in self.layout.spans.values():
            t = span.target
            a = flat[span.a_offset:span.a_offset + int(np.prod(span.a_shape))]
            b = flat[span.b_offset:span.b_offset + int(np.prod(span.b_shape))]
            pool_a = _leaf(pool, t.path + (LORA_A,))
            pool_b = _leaf(pool, t.path + (LORA_B,))
            out.append((t.path + (LORA_A,), jax.lax.dynamic_update_index_in_dim(
                pool_a, a.reshape(span.a_shape), index, len(t.in_shape))))
            out.append((t.path + (LORA_B,), jax.lax.dynamic_update_index_in_dim(
                pool_b, b.reshape(span.b_shape), index, 0)))
        return _nest(out)

    def stage(self, flat: np.ndarray):
        """A loaded adapter's flat buffer where `write` copies it from
        fastest: pinned host memory on a GPU, NumPy as it is on the CPU
        (whose slots are in that same memory)."""
        if self._staging is None:
            return flat
        return jax.device_put(flat, self._staging)

    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Queues ``adapter`` into ``slot`` (1-based) on the device; returns
        without waiting."""
        flat = jax.device_put(adapter.flat, self._flat_sharding)
        self.arrays = self._write(self.arrays, np.int32(slot - 1), flat)

    def warm_up(self) -> None:
        """Compiles the slot writer (writes zeros into slot 1, which holds
        nothing yet)."""
        zeros = np.zeros(self.layout.size, np.dtype(self.dtype))
        flat = jax.device_put(zeros, self._flat_sharding)
        self.arrays = self._write(self.arrays, np.int32(0), flat)
