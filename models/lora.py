"""LoRA in the model: which linear layers take an adapter, and the batched
adapter product a `Linear` adds to its output.

The engine keeps a device pool of ``num_slots`` adapters per target layer
and hands it to ``run_model`` beside the params; this module turns it into
the ``lora`` variable collection (``lora_collection``), one entry per target
`Linear` at the Linear's own scope path, each holding its pool pair and the
step's per-token slot ids. A `Linear` whose scope has that entry adds the
delta of every token's adapter (``lora_delta``) to whatever its weight
method computed, so LoRA composes with any `LinearMethod` (quantized or
not) and no layer or model family names it.

Pool layout per target layer, ``in_shape + out_shape`` being its kernel's:

    lora_a: in_shape + (num_slots, rank)     x @ A for every slot at once
    lora_b: (num_slots, rank) + out_shape    scaling already folded in

Slot ids count from 1: a token with slot 0 runs the base model alone. The
rank axis is padded with zeros to the pool's rank, which adds nothing.

Logical axes: A keeps the kernel's input axes and B its output axes, so
under tensor parallelism A of a column-parallel layer is replicated and B
split like the kernel's output (its delta lands already split), while a
row-parallel layer splits A on its input and its partial shrinks are summed
with the base product's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import linen as nn

if TYPE_CHECKING:
    from .config import ModelConfig
    from .spec import ModelSpec

COLLECTION = "lora"
LORA_A = "lora_a"
LORA_B = "lora_b"
TOKEN_SLOTS = "token_slots"  # [T] int32 per token, 0 = no adapter
SLOT_AXES = ("lora_slots", "lora_rank")


@dataclasses.dataclass(frozen=True)
class LoRATarget:
    """A linear layer an adapter may change."""
    hf_module: str  # the module's name in HF checkpoints (and PEFT adapters)
    path: tuple[str, ...]  # the Linear's scope path in our params
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_axes: tuple[str, ...]  # logical axis names of in_shape
    out_axes: tuple[str, ...]

    @property
    def short_name(self) -> str:  # what PEFT's target_modules name (q_proj)
        return self.hf_module.rsplit(".", 1)[-1]

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    @property
    def out_features(self) -> int:
        return math.prod(self.out_shape)

    def a_shape(self, num_slots: int, rank: int) -> tuple[int, ...]:
        return self.in_shape + (num_slots, rank)

    def b_shape(self, num_slots: int, rank: int) -> tuple[int, ...]:
        return (num_slots, rank) + self.out_shape

    @property
    def a_axes(self) -> tuple[str, ...]:
        return self.in_axes + SLOT_AXES

    @property
    def b_axes(self) -> tuple[str, ...]:
        return SLOT_AXES + self.out_axes


def lora_targets(model: nn.Module, cfg: ModelConfig, spec: ModelSpec
                 ) -> dict[str, LoRATarget]:
    """Every `Linear` of ``model`` that has a checkpoint weight, by its HF
    module name (``model.layers.0.self_attn.q_proj``), in forward order.

    The Linears are found by tracing an abstract init with flax's method
    interception (nothing is allocated), and named through the family's
    own weight list (``spec.weights``: the param path of each HF tensor),
    so a family gets LoRA without listing anything for it."""
    from .abstract import abstract_variables
    from .layers import Linear
    found: dict[tuple[str, ...], Linear] = {}

    def record(next_fun: Callable[..., Any], args: tuple, kwargs: dict,
               context: Any) -> Any:
        if isinstance(context.module, Linear) and context.method_name == "__call__":
            found.setdefault(tuple(context.module.path), context.module)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        abstract_variables(model, cfg, every_layer=True)
    by_path: dict[tuple[str, ...], str] = {}
    for w in spec.weights(cfg):
        module = w.path[:-1]
        if w.hf_name.endswith(".weight") and module in found:
            by_path.setdefault(module, w.hf_name[:-len(".weight")])
    # A checkpoint tensor that several of our layers are cut from (Phi-3's
    # fused qkv_proj) has no one layer an adapter of it could wrap, so it
    # is no target (an adapter naming it is refused).
    fused = {m for m in by_path.values()
             if list(by_path.values()).count(m) > 1}
    targets = {}
    for path, linear in found.items():
        if path not in by_path or by_path[path] in fused:
            continue
        n_in = len(linear.in_shape)
        targets[by_path[path]] = LoRATarget(
            hf_module=by_path[path], path=path, in_shape=tuple(linear.in_shape),
            out_shape=tuple(linear.out_shape),
            in_axes=tuple(linear.axes[:n_in]), out_axes=tuple(linear.axes[n_in:]))
    return targets


# Per trace: each layer input the adapters' shrinks read, behind an
# optimization barrier (`_shrink_input`), by id, holding the input itself so
# that its id cannot be reused while the entry lives. (Two traces at once in
# two threads can only miss each other's entries: an extra barrier, the
# same values.)
_SHRINK_INPUTS: dict[int, tuple[jax.Array, jax.Array]] = {}


def _shrink_input(x: jax.Array) -> jax.Array:
    """``x`` as the adapters' shrinks see it: one optimization barrier per
    distinct input, shared by the layers that read it (q/k/v, gate/up).

    Why: XLA's dot-merger joins dots that share an input. Without the
    barrier it merged the shrinks with the base projections of the same
    input (k/v and the A's), concatenating those weights at run time in
    every step (`docs/performance.md`, "LoRA"); the barrier leaves the
    base projections merged as without LoRA and the shrinks merged among
    themselves."""
    hit = _SHRINK_INPUTS.get(id(x))
    if hit is not None and hit[0] is x:
        return hit[1]
    xb = jax.lax.optimization_barrier(x)
    _SHRINK_INPUTS[id(x)] = (x, xb)
    return xb


def lora_collection(pool: dict, token_slots: jax.Array) -> dict:
    """The ``lora`` variables of one step: the pool tree (nested by scope
    path, ``{LORA_A, LORA_B}`` at each target) with the step's per-token
    slot ids added beside every pair."""
    _SHRINK_INPUTS.clear()  # a new trace: the last one's inputs are dead
    return _with_slots(pool, token_slots)


def _with_slots(pool: dict, token_slots: jax.Array) -> dict:
    if LORA_A in pool:
        return {**pool, TOKEN_SLOTS: token_slots}
    return {k: _with_slots(v, token_slots) for k, v in pool.items()}


def has_lora(module: nn.Module) -> bool:
    return module.has_variable(COLLECTION, LORA_A)


def lora_delta(module: nn.Module, x: jax.Array) -> jax.Array:
    """x [T, *in_shape] -> [T, *out_shape]: each token's adapter product
    ``x A_s B_s`` for its slot s (zero for slot 0)."""
    a: jax.Array = module.get_variable(COLLECTION, LORA_A)
    b: jax.Array = module.get_variable(COLLECTION, LORA_B)
    slots: jax.Array = module.get_variable(COLLECTION, TOKEN_SLOTS)
    return lora_product(_shrink_input(x), a, b, slots)


def lora_product(
    x: jax.Array,  # [T, *in_shape]
    a: jax.Array,  # [*in_shape, num_slots, rank]
    b: jax.Array,  # [num_slots, rank, *out_shape]
    slots: jax.Array,  # [T] int32, 0 = no adapter
    method: str | None = None,
) -> jax.Array:  # [T, *out_shape]
    """The batched adapter product for all tokens at once.

    ``dense``: every token through every slot's A (one matmul against the
    whole pool, [T, num_slots * rank]), the slots a token does not use
    masked to zero, then one matmul against every slot's B. It reads each
    slot's weights once, whatever the token count, which is what a decode
    step (memory-bound) wants.
    ``gather``: each token's own A and B gathered, then per-token products;
    it reads T copies of an adapter, less than the pool only when there
    are fewer tokens than slots.
    None picks the one that reads fewer bytes for these (static) shapes."""
    num_slots = b.shape[0]
    if method is None:
        method = "gather" if x.shape[0] < num_slots else "dense"
    n_in = a.ndim - 2
    in_axes = tuple(range(1, 1 + n_in))
    if method == "dense":
        xa = jax.lax.dot_general(x, a, ((in_axes, tuple(range(n_in))), ((), ())))
        mask = slots[:, None] == jnp.arange(1, num_slots + 1, dtype=slots.dtype)
        xa = xa * mask[:, :, None].astype(xa.dtype)  # [T, num_slots, rank]
        return jax.lax.dot_general(xa, b, (((1, 2), (0, 1)), ((), ())))
    if method != "gather":
        raise ValueError(f"lora_product method must be 'dense' or 'gather', "
                         f"got {method!r}")
    index = jnp.maximum(slots - 1, 0)
    a_rows = jnp.take(a, index, axis=n_in)  # in_shape + (T, rank)
    xa = jax.lax.dot_general(x, a_rows, ((in_axes, tuple(range(n_in))),
                                         ((0,), (n_in,))))  # [T, rank]
    xa = xa * (slots > 0)[:, None].astype(xa.dtype)
    b_rows = jnp.take(b, index, axis=0)  # [T, rank, *out_shape]
    return jax.lax.dot_general(xa, b_rows, (((1,), (1,)), ((0,), (0,))))
