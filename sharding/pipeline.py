"""Pipeline parallelism: a model's layers split into stages over the
"stage" mesh axis, in one SPMD program.

Layout. With ``pp`` stages and ``L`` layers (``pp`` divides ``L``), stage s
holds layers ``s*Lp .. (s+1)*Lp - 1`` (``Lp = L // pp``). One program over
the whole mesh needs each layer's weights as a slice of an array sharded on
"stage", so params are regrouped by *slot*: slot j holds, along a leading
``[pp]`` axis, layer j of every stage (layer ``s*Lp + j`` on stage s). Each
device keeps only its stage's layers; nothing is replicated across stages.
The KV pool is regrouped the same way (slot j's pages ``[pp, K, num_pages,
B, H]``). Embedding and lm_head are vocab-parallel over both axes
("stage", "model"), so they too are split rather than copied per stage.

Loading. Each layer's params are first placed on their stage's devices
alone (``stage_mesh``), by whichever loader runs, then ``stack_slots``
assembles the slot arrays from those very device buffers
(``make_array_from_single_device_arrays``), one param at a time. Over
several processes, a process never reads the layers of stages it does not
hold (they come as stand-ins, ``Placement.elsewhere``).

Schedule. ``PipelinedModel.apply`` runs the stages under ``shard_map``,
manual over "stage" only (tensor parallelism inside a stage stays with
GSPMD): ``pp`` ticks; at tick t stage t runs its layers (``lax.cond``: the
others skip) and ``ppermute`` hands the activations to stage t + 1; the last
stage's output is then broadcast over the stage axis for the head.

No micro-batches within a step: a decode step is bound by reading weights,
and each micro-batch would read its stage's weights again, so splitting a
step costs more than the overlap gains; only compute-bound prefill steps
would gain. Stages would overlap across steps with ``pp`` independent
batches in flight (vLLM's virtual engines), which the engine does not do
yet: a pipelined engine fits a model ``pp`` times larger at one device's
throughput.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .mesh import stage_mesh
from .rules import _RULES

_LAYER = re.compile(r"layers_(\d+)$")


def layers_per_stage(num_layers: int, pipeline_parallel_size: int) -> int:
    if num_layers % pipeline_parallel_size:
        raise ValueError(
            f"pipeline_parallel_size={pipeline_parallel_size} must divide "
            f"the number of layers ({num_layers})")
    return num_layers // pipeline_parallel_size


def _spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh
          ) -> PartitionSpec:
    """The TP rules of rules.py, with the vocab split over stage x model."""
    axes: list[Any] = []
    both = mesh.shape["stage"] * mesh.shape["model"]
    for name, dim in zip(names, shape):
        axis: str | tuple[str, str] | None = (
            None if name is None else _RULES.get(name))
        if name == "vocab" and dim % both == 0:
            axis = ("stage", "model")
        elif axis is not None and dim % mesh.shape[axis]:
            axis = None
        axes.append(axis)
    return PartitionSpec(*axes)


def load_shardings(abstract_params: dict[str, Any], mesh: Mesh
                   ) -> dict[str, Any]:
    """Where each param is placed while loading: layer i's on its stage's
    devices alone, the rest over the whole mesh."""
    pp = mesh.shape["stage"]
    num_layers = sum(1 for k in abstract_params if _LAYER.match(k))
    per_stage = layers_per_stage(num_layers, pp)

    def one(target: Mesh, leaf: Any) -> NamedSharding:
        if isinstance(leaf, nn.LogicallyPartitioned):
            spec = _spec(leaf.names, leaf.value.shape, target)
            return NamedSharding(target, spec)
        return NamedSharding(target, PartitionSpec())

    out = {}
    for key, sub in abstract_params.items():
        m = _LAYER.match(key)
        target = stage_mesh(mesh, int(m.group(1)) // per_stage) if m else mesh
        out[key] = jax.tree_util.tree_map(
            lambda leaf, target=target: one(target, leaf), sub,
            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    return out


def slot_sharding(mesh: Mesh, layer_sharding: NamedSharding) -> NamedSharding:
    """A slot array's sharding: "stage" on the leading axis, then the
    layer's own spec."""
    return NamedSharding(mesh, PartitionSpec("stage", *layer_sharding.spec))


def stack_slots(params: dict, mesh: Mesh) -> dict:
    """Per-layer params on their stages -> {"shared": the other params,
    "slots": [Lp trees of [pp, ...] arrays]}; the layer arrays are consumed
    (their buffers become the slot arrays' shards)."""
    pp = mesh.shape["stage"]
    layers = sorted((int(m.group(1)), k) for k in params
                    if (m := _LAYER.match(k)))
    per_stage = layers_per_stage(len(layers), pp)
    shared = {k: v for k, v in params.items() if not _LAYER.match(k)}
    slots = []
    for j in range(per_stage):
        group = [params[f"layers_{s * per_stage + j}"] for s in range(pp)]
        slots.append(jax.tree_util.tree_map(
            lambda *leaves: _stack(mesh, leaves), *group))
    return {"shared": shared, "slots": slots}


def _stack(mesh: Mesh, leaves: Sequence[Any]) -> jax.Array:
    # A stage on another process's devices comes as a stand-in (a
    # ShapeDtypeStruct: its tensor was never read here); this process's
    # own stage gives the shape and dtype.
    held = [leaf for leaf in leaves if isinstance(leaf, jax.Array)]
    sharding = slot_sharding(mesh, leaves[0].sharding)
    pieces = [jnp.expand_dims(shard.data, 0) for leaf in held
              for shard in leaf.addressable_shards]
    out = jax.make_array_from_single_device_arrays(
        (len(leaves), *held[0].shape), sharding, pieces)
    for leaf in held:
        leaf.delete()
    return out


def kv_slot_sharding(num_kv_heads: int, mesh: Mesh) -> NamedSharding:
    """Slot pages [pp, K, num_pages, B, H]: stages, then kv heads on
    "model" when it divides them (replicated otherwise, as rules.py)."""
    heads = "model" if num_kv_heads % mesh.shape["model"] == 0 else None
    return NamedSharding(mesh, PartitionSpec("stage", heads))


class PipelinedModel:
    """The model's ``apply`` (models.runtime.run_model's call) with the
    layers run stage by stage; params as ``stack_slots`` returns them."""

    def __init__(self, model: Any, mesh: Mesh) -> None:
        self.model = model
        self.mesh = mesh
        self.pp = mesh.shape["stage"]

    def apply(self, variables, input_ids, positions, kv_pages, md,
              logits_indices, inputs_embeds=None):
        params = variables["params"]
        shared = {"params": params["shared"],
                  "constants": variables["constants"]}
        x, aux = self.model.apply(shared, input_ids, positions, inputs_embeds,
                                  method="layer_inputs")
        x, kv_pages = self._stages(params["slots"], kv_pages, x, aux, md)
        logits = self.model.apply(shared, x, logits_indices, method="head")
        return logits, kv_pages

    def _stages(self, slots, kv_pages, x, aux, md):
        layer, pp = self.model.decoder_layer(), self.pp

        def body(slots, kv_pages, x, aux, md):
            stage = jax.lax.axis_index("stage")
            local = [jax.tree_util.tree_map(lambda a: a[0], t) for t in slots]
            pages = [(k[0], v[0]) for k, v in kv_pages]

            def run(x, pages):
                new = []
                for p, kv in zip(local, pages):
                    x, kv = layer.apply({"params": p}, x, aux, kv, md)
                    new.append(kv)
                return x, new

            def skip(x, pages):
                return x, pages

            for t in range(pp):
                x, pages = jax.lax.cond(stage == t, run, skip, x, pages)
                if t < pp - 1:  # to the next stage; stage 0 gets zeros
                    x = jax.lax.ppermute(x, "stage",
                                         [(i, i + 1) for i in range(pp - 1)])
            # Only the last stage holds the output: sum it over the stages
            # with zeros elsewhere (exact), so every stage has it.
            x = jax.lax.psum(jnp.where(stage == pp - 1, x, jnp.zeros_like(x)),
                             "stage")
            return x, [(k[None], v[None]) for k, v in pages]

        stage, rep = PartitionSpec("stage"), PartitionSpec()
        run_stages = jax.shard_map(
            body, mesh=self.mesh, in_specs=(stage, stage, rep, rep, rep),
            out_specs=(rep, stage), axis_names={"stage"}, check_vma=False)
        return run_stages(slots, kv_pages, x, aux, md)
