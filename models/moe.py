"""Mixture-of-experts feed-forward: top-k routing and the experts as a
grouped matmul, the MLP kind that Mixtral and Qwen3-MoE decoder layers plug
in (``mlp_cls``; the rest of the layer is Llama's).

Each token's hidden row goes to its k best experts. The T*k (token, expert)
pairs are sorted by expert so that each expert's rows are contiguous, and
each projection multiplies every group by its expert's weights: the work is
the rows routed, not every expert over every token
(``dense_experts_reference`` is that dense loop, for tests and the
benchmark). On a GPU the grouped product is the Pallas kernel of
``pallas_kernels/grouped_matmul.py`` (XLA's GPU ``ragged_dot`` multiplies
every row by every expert and selects: E times the work and memory);
elsewhere ``jax.lax.ragged_dot``.

Expert weights are stacked ``[E, ...]`` with the logical axis ``experts``.
Under tensor parallelism the sharding rules split the experts over the
model axis when it divides E (expert parallelism) and each expert's hidden
axis ``mlp`` otherwise; either way every device holds a slice of the work
for all tokens (activations are replicated between layers), computes it
under ``shard_map`` and the slices are summed over the model axis, as a
row-parallel projection's are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, PartitionSpec

from jaxinfer.pallas_kernels.grouped_matmul import Int4Weights, contraction
from jaxinfer.sharding.rules import logical_spec

from .config import ModelConfig, decoder_config_from_hf
from .errors import ModelConfigError
from .layers import param
from .llama import LlamaForCausalLM
from .mlp import ACTIVATIONS
from .moe_weights import (
    DOWN_AXES,
    EXPERT_AXES,
    ExpertWeights,
    QuantizedExperts,
    expert_codes_dtype,
    expert_floats,
    expert_int4_scheme,
    expert_params,
    expert_shape,
)
from .quantization.errors import UnsupportedQuantizationConfigError
from .spec import StackedExpertsLayout, WeightSpec

# How the grouped product runs: "pallas" (the Triton-lowered kernel, GPU),
# "pallas_interpret" (that kernel interpreted: CPU tests), "ragged_dot"
# (jax.lax.ragged_dot); None: "pallas" on a GPU, "ragged_dot" elsewhere.
EXPERTS_IMPLS = ("pallas", "pallas_interpret", "ragged_dot")
EXPERTS_IMPL: str | None = None



@dataclasses.dataclass(frozen=True)
class MoEConfig(ModelConfig):
    """A decoder whose every layer's MLP is a mixture of experts."""
    num_experts: int = 1  # E
    num_experts_per_tok: int = 1  # k experts each token runs through
    moe_intermediate_size: int = 1  # F of one expert
    # Renormalise the k chosen routing probabilities to sum to one
    # (Mixtral always; Qwen3-MoE as its norm_topk_prob says).
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_experts < 1:
            raise ModelConfigError(
                f"num_experts must be >= 1, got {self.num_experts}")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ModelConfigError(
                f"num_experts_per_tok must be in [1, num_experts="
                f"{self.num_experts}], got {self.num_experts_per_tok}")
        if self.moe_intermediate_size < 1:
            raise ModelConfigError(
                "moe_intermediate_size must be >= 1, got "
                f"{self.moe_intermediate_size}")
        q = self.quantization
        if q is not None and expert_codes_dtype(self) is None \
                and expert_int4_scheme(self) is None:
            # Only the attention's Linear layers would take it: the experts,
            # most of the weights, would stay unquantized without a word.
            raise UnsupportedQuantizationConfigError(
                f"quantization={q.method!r} (checkpoint format "
                f"{q.checkpoint_format!r}, {q.scheme}): "
                f"{self.architecture}'s expert weights are served from "
                "4-bit AWQ or GPTQ checkpoints (zero points, groups of a "
                "multiple of 32 inputs, GPTQ without desc_act), from fp8 "
                "checkpoints (per tensor or channel scales), or quantized "
                "at load from a float checkpoint with quantization='fp8' "
                "or 'int8'; serve one of those (a GGUF file's quantized "
                "tensors are dequantized at load)")


def route(router_logits: jax.Array,  # [T, E]
          k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
    """Softmax over the experts, then the k most probable: (weights [T, k]
    float32, expert ids [T, k] int32); the weights renormalised to sum to
    one when ``renormalize``."""
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def experts_impl(impl: str | None = None) -> str:
    """The grouped product's implementation (``EXPERTS_IMPLS``)."""
    impl = impl or EXPERTS_IMPL
    if impl is None:
        return "pallas" if jax.default_backend() == "gpu" else "ragged_dot"
    if impl not in EXPERTS_IMPLS:
        raise ValueError(f"experts implementation {impl!r} is not one of "
                         f"{', '.join(EXPERTS_IMPLS)}")
    return impl


def grouped_experts(x: jax.Array,  # [T, D]
                    weights: jax.Array,  # [T, k] float32
                    experts: jax.Array,  # [T, k] int32, global expert ids
                    gate: ExpertWeights,  # [E_local, D, F]
                    up: ExpertWeights,  # [E_local, D, F]
                    down: ExpertWeights,  # [E_local, F, D]
                    act: Callable[[jax.Array], jax.Array],
                    first_expert: jax.Array | int = 0,
                    impl: str | None = None,
                    ) -> jax.Array:  # [T, D] float32
    """sum_k weights[t, k] * MLP_{experts[t, k]}(x[t]) over the experts this
    device holds (ids ``first_expert`` .. ``first_expert + E_local - 1``;
    pairs routed elsewhere contribute zero), each projection one grouped
    product over the (token, expert) pairs sorted by expert."""
    T, k = experts.shape
    e_local = expert_shape(gate)[0]
    local = experts.reshape(-1) - first_expert  # [T*k]
    here = (local >= 0) & (local < e_local)
    impl = experts_impl(impl)
    if impl != "ragged_dot" and kernel_takes(gate, down):
        return _tiled_experts(x, weights, local, here, gate, up, down, act,
                              interpret=impl == "pallas_interpret")
    gate, up, down = (expert_floats(w, x.dtype) for w in (gate, up, down))
    # Pairs of other devices' experts sort last, into no group: ragged_dot
    # leaves rows past the groups' total zero and does no work for them.
    group_of = jnp.where(here, local, e_local)
    order = jnp.argsort(group_of, stable=True)  # [T*k]
    token = order // k
    group_sizes = jnp.bincount(group_of, length=e_local + 1)[:e_local]
    rows = jnp.take(x, token, axis=0)  # [T*k, D]
    gs = group_sizes.astype(jnp.int32)
    h = (act(jax.lax.ragged_dot(rows, gate, gs))
         * jax.lax.ragged_dot(rows, up, gs))  # [T*k, F]
    y = jax.lax.ragged_dot(h, down, gs)  # [T*k, D]
    w = jnp.where(here, weights.reshape(-1), 0.0)[order]
    out = jnp.zeros(x.shape, jnp.float32)
    return out.at[token].add(y.astype(jnp.float32) * w[:, None])


def kernel_takes(gate: ExpertWeights, down: ExpertWeights) -> bool:
    """Whether the grouped-matmul kernel takes these experts: hidden size D
    and expert size F multiples of its 16-wide blocks, and 4-bit weights'
    scale groups a multiple of 32 inputs; ragged_dot serves others."""
    _, D, F = expert_shape(gate)
    if isinstance(gate, Int4Weights) and isinstance(down, Int4Weights):
        from jaxinfer.pallas_kernels.grouped_matmul import int4_takes
        return (int4_takes(D, F, D // gate.scales.shape[1])
                and int4_takes(F, D, F // down.scales.shape[1]))
    return D % 16 == 0 and F % 16 == 0


def _quant_group(w: ExpertWeights) -> int | None:
    """Inputs per scale of 4-bit weights (None: other weights)."""
    if isinstance(w, Int4Weights):
        return contraction(w) // w.scales.shape[1]
    return None


def _tiled_experts(x: jax.Array, weights: jax.Array, local: jax.Array,
                   here: jax.Array, gate: ExpertWeights, up: ExpertWeights,
                   down: ExpertWeights,
                   act: Callable[[jax.Array], jax.Array],
                   interpret: bool) -> jax.Array:  # [T, D] float32
    """``grouped_experts`` on the grouped-matmul kernel: the pairs' rows in
    expert-aligned tiles (``tile_layout``), gate and up in one pass, down,
    then each token's k rows weighted and summed."""
    from jaxinfer.pallas_kernels.grouped_matmul import (
        default_tuning,
        grouped_gated_matmul,
        grouped_matmul,
        tile_layout,
    )
    T, D = x.shape
    P = local.shape[0]
    k = P // T

    e_local, _, F = expert_shape(gate)
    t_in = default_tuning(P, D, F, e_local, _quant_group(gate))
    t_out = dataclasses.replace(
        default_tuning(P, F, D, e_local, _quant_group(down)),
        block_m=t_in.block_m)

    def split(w: ExpertWeights) -> tuple[Any, jax.Array | None]:
        if isinstance(w, QuantizedExperts):
            return w.codes, w.scale
        return w, None
    (gate, gate_s), (up, up_s), (down, down_s) = map(split, (gate, up, down))
    row, tile_group = tile_layout(jnp.where(here, local, e_local), e_local,
                                  t_in.block_m)
    M = tile_group.shape[0] * t_in.block_m
    token = jnp.arange(P, dtype=jnp.int32) // k
    # Row M is where pairs of no local expert go; it is cut off again.
    rows = jnp.zeros((M + 1, D), x.dtype).at[row].set(x[token])[:M]
    h = grouped_gated_matmul(rows, gate, up, tile_group, gate_s, up_s,
                             act=act, tuning=t_in, interpret=interpret)
    y = grouped_matmul(h, down, tile_group, down_s, tuning=t_out,
                       interpret=interpret)
    y = jnp.concatenate([y, jnp.zeros((1, D), y.dtype)])[row]  # [P, D]
    w = jnp.where(here, weights.reshape(-1), 0.0)
    return (y.astype(jnp.float32) * w[:, None]).reshape(T, k, D).sum(axis=1)


def dense_experts_reference(x: jax.Array, weights: jax.Array,
                            experts: jax.Array, gate: jax.Array,
                            up: jax.Array, down: jax.Array,
                            act: Callable[[jax.Array], jax.Array]
                            ) -> jax.Array:  # [T, D] float32
    """``grouped_experts`` as a loop over every expert applied to every
    token, each output weighted by the token's routing weight for that
    expert (zero where it was not chosen)."""
    gate, up, down = (expert_floats(w, x.dtype) for w in (gate, up, down))
    out = jnp.zeros(x.shape, jnp.float32)
    for e in range(gate.shape[0]):
        w_e = jnp.sum(jnp.where(experts == e, weights, 0.0), axis=-1)  # [T]
        y = (act(x @ gate[e]) * (x @ up[e])) @ down[e]
        out = out + y.astype(jnp.float32) * w_e[:, None]
    return out


def _weight_spec(w: ExpertWeights, axes: tuple[str, str, str], mesh: Mesh
                 ) -> Any:
    """The PartitionSpec (a tuple of them for codes) of one projection's
    experts as the sharding rules place them: codes and their scales
    split alike."""
    if isinstance(w, QuantizedExperts):
        spec = logical_spec(axes, w.codes.shape, mesh)
        return QuantizedExperts._make((spec, PartitionSpec(spec[0], spec[2])))
    if isinstance(w, Int4Weights):
        packed, groups = (logical_spec(axes, a.shape, mesh)
                          for a in (w.packed, w.scales))
        if packed != groups:
            E, G = w.scales.shape[:2]
            raise ModelConfigError(
                f"4-bit experts [{E}, {contraction(w)}, "
                f"{w.packed.shape[2]}] in {G} scale groups cannot be split "
                f"over a model axis of {mesh.shape['model']}: it must divide "
                "the expert count or the scale groups; choose a "
                "tensor_parallel_size that does")
        return Int4Weights._make((packed, groups, groups))
    return logical_spec(axes, w.shape, mesh)


def _sharded_experts(mesh: Mesh, gate: ExpertWeights, up: ExpertWeights,
                     down: ExpertWeights,
                     act: Callable[[jax.Array], jax.Array]
                     ) -> Callable[..., jax.Array] | None:
    """``grouped_experts`` over the model axis, each device on the expert
    weights the sharding rules gave it, the partial outputs summed; None
    when the rules leave the expert weights whole (one device, or neither
    E nor F divisible by the model axis)."""
    if "model" not in mesh.shape or mesh.shape["model"] == 1:
        return None
    gate_in = _weight_spec(gate, EXPERT_AXES, mesh)
    up_in = _weight_spec(up, EXPERT_AXES, mesh)
    down_in = _weight_spec(down, DOWN_AXES, mesh)
    first_spec = jax.tree.leaves(gate_in)[0]
    if all(a is None for a in first_spec):
        return None
    by_expert = first_spec[0] == "model"

    def per_device(x: jax.Array, weights: jax.Array, experts: jax.Array,
                   gate: ExpertWeights, up: ExpertWeights,
                   down: ExpertWeights) -> jax.Array:
        n = expert_shape(gate)[0]
        first = jax.lax.axis_index("model") * n if by_expert else 0
        part = grouped_experts(x, weights, experts, gate, up, down, act,
                               first)
        return jax.lax.psum(part, "model")

    rep = PartitionSpec()
    in_specs = (rep, rep, rep, gate_in, up_in, down_in)
    context = jax.sharding.get_abstract_mesh()
    if not context.empty and context.manual_axes:
        # Inside another shard_map (pipeline stages): nest on its mesh.
        return jax.shard_map(per_device, mesh=context, in_specs=in_specs,
                             out_specs=rep, check_vma=False,
                             axis_names={"model"})
    return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs,
                         out_specs=rep, check_vma=False)


class SparseMoeBlock(nn.Module):
    """[T, D] -> [T, D]: router, top-k, the chosen experts' gated MLPs
    (act(x W_gate) * (x W_up) W_down) weighted by their routing weights."""
    cfg: MoEConfig
    dtype: jnp.dtype
    mesh: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        D, E = c.hidden_size, c.num_experts
        # The router stays in the model's dtype and unquantized, as the
        # checkpoints ship it; its softmax runs in float32.
        router = param(self, "router", (D, E), ("embed", "router"),
                       self.dtype)
        gate, up, down = expert_params(self, c, self.dtype)
        weights, experts = route(x @ router, c.num_experts_per_tok,
                                 c.norm_topk_prob)
        act = ACTIVATIONS[c.hidden_act]
        sharded = (None if self.mesh is None else _sharded_experts(
            self.mesh, gate, up, down, act))
        if sharded is None:
            out = grouped_experts(x, weights, experts, gate, up, down, act)
        else:
            out = sharded(x, weights, experts, gate, up, down)
        return out.astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class ExpertNames:
    """How a checkpoint names one MoE block's tensors under the block's
    prefix: the router, and each expert's three projections (``{e}`` is
    the expert index). ``weights`` lists them, so an instance serves as
    ``llama.decoder_weights``' ``mlp_cls``."""
    router: str  # "gate"
    gate: str  # "experts.{e}.gate_proj" / "experts.{e}.w1"
    up: str
    down: str

    def gguf_layer_names(self, block: str) -> dict[str, str]:
        """llama.cpp's ``blk.N.<name>`` -> HF names of a decoder layer whose
        experts sit under ``block``: the attention's as Llama's, the
        router, and each projection's experts stacked under one name."""
        from .llama import GGUF_LAYER_NAMES

        def stacked(pattern: str) -> str:
            return f"{block}.{pattern.replace('{e}.', '')}"
        return {**{k: v for k, v in GGUF_LAYER_NAMES.items()
                   if not v.startswith("mlp.")},
                "ffn_gate_inp": f"{block}.{self.router}",
                "ffn_gate_exps": stacked(self.gate),
                "ffn_up_exps": stacked(self.up),
                "ffn_down_exps": stacked(self.down)}

    def weights(self, cfg: MoEConfig, hf_prefix: str, path: tuple
                ) -> Iterator[WeightSpec]:
        """One block's tensors. Each projection's E per-expert HF tensors
        load as one stacked param (``WeightSpec.parts``); a checkpoint
        that stores them stacked (GGUF) answers the stacked name, the
        pattern without its ``{e}.``."""
        D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        yield WeightSpec(hf_prefix + f"{self.router}.weight",
                         path + ("router",), (E, D),
                         lambda w: np.asarray(w).T)
        for ours, pattern, out_dim, in_dim in (
                ("gate_proj", self.gate, F, D), ("up_proj", self.up, F, D),
                ("down_proj", self.down, D, F)):
            parts = tuple(hf_prefix + pattern.format(e=e) + ".weight"
                          for e in range(E))
            stacked = hf_prefix + pattern.replace("{e}.", "") + ".weight"
            yield WeightSpec(stacked, path + (ours,), (E, out_dim, in_dim),
                             StackedExpertsLayout(), parts=parts)


def moe_config_from_hf(hf: dict[str, Any], architecture: str,
                       moe_fields: dict[str, Any],
                       **family_fields: Any) -> MoEConfig:
    """``decoder_config_from_hf``'s fields (``family_fields`` as there)
    plus the MoE ones the family read from its config (``moe_fields``)."""
    base = decoder_config_from_hf(hf, architecture, **family_fields)
    fields = {f.name: getattr(base, f.name)
              for f in dataclasses.fields(ModelConfig)}
    return MoEConfig(**fields, **moe_fields)


class MoEForCausalLM(LlamaForCausalLM):
    """Llama's decoder with a mixture of experts as every layer's MLP."""
    mlp_cls = SparseMoeBlock
