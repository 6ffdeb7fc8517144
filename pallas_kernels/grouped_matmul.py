"""Grouped matmul for mixture-of-experts layers (Pallas, Triton lowering;
interpret mode on CPU): rows laid out in row tiles that each belong to one
group (expert), every tile multiplied by its group's weight matrix.

Why it exists: XLA's GPU lowering of ``jax.lax.ragged_dot`` multiplies
every row by every group's weights and selects afterwards, E times the
work and an [rows, E * N] temporary (12 GiB for one Qwen3-30B-A3B prefill
chunk of 8192 tokens). Here a row tile reads only its own expert's
weights, so the work is the rows routed.

Layout (``tile_layout``): the (token, expert) pairs are sorted by expert and
each expert's run of rows starts on a tile boundary (vLLM's fused-MoE
"block-aligned" layout); the padding rows are zeros and their outputs
ignored. ``tile_group[t]`` is the expert of row tile t, or -1 for a tile
past the last group's rows (the program writes zeros and reads nothing).
The row count is static: at most ``pairs + groups * (block_m - 1)``, which
``num_tiles`` rounds to whole tiles.

The gated form computes ``act(x W_gate) * (x W_up)`` in one pass over x
(two accumulators), the first half of an expert MLP.

Quantized weights (int8 or fp8 codes, weight-only) come with one float32
scale per group and output feature: each code block is widened to x's
dtype in registers for the dot and the accumulated product scaled by its
columns' scales, ``x (q * s) = (x q) * s``. 4-bit codes (AWQ / GPTQ
experts, ``Int4Weights``) carry a scale and a zero point per group of
inputs and output feature, so each block is dequantized in registers
before its dot: the block's even and odd inputs sit in a byte's low and
high nibbles, and the rows' even and odd columns (split once, outside the
kernel) multiply them as two dots.

Anatomy as the other kernels': kernel bodies, ``pallas_call`` builder,
jitted wrappers with a validated frozen tuning, ``jnp`` references.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .kernel_common import Ref, cdiv


class GroupedMatmulShapeError(ValueError):
    """Shapes the kernel cannot take; says what to change."""


class Int4Weights(NamedTuple):
    """Each group's 4-bit weights [E, K, N]: ``w[e, k, n] = (q[e, k, n] -
    zeros[e, k // gs, n]) * scales[e, k // gs, n]`` with ``gs = K / G``;
    ``q`` packed two per byte along K, input 2j in the low nibble of byte
    j and 2j + 1 in the high one (the int4 linear layers' order)."""
    packed: jax.Array  # [E, K / 2, N] uint8
    scales: jax.Array  # [E, G, N] float
    zeros: jax.Array  # [E, G, N] uint8


def int4_floats(w: Int4Weights) -> jax.Array:
    """The float32 weights [E, K, N] of 4-bit codes."""
    E, Kh, N = w.packed.shape
    q = jnp.stack([w.packed & 0xF, w.packed >> 4], axis=2).reshape(E, 2 * Kh, N)
    G = w.scales.shape[1]
    q = q.reshape(E, G, 2 * Kh // G, N).astype(jnp.int32)
    q = q - w.zeros.astype(jnp.int32)[:, :, None, :]
    return (q.astype(jnp.float32)
            * w.scales.astype(jnp.float32)[:, :, None, :]).reshape(E, 2 * Kh, N)


def contraction(w: jax.Array | Int4Weights) -> int:
    """K of weights [E, K, N], packed or not."""
    if isinstance(w, Int4Weights):
        return 2 * w.packed.shape[1]
    return w.shape[1]


@dataclasses.dataclass(frozen=True)
class GroupedMatmulTuning:
    block_m: int = 64  # rows per tile (>= 16: tensor-core tiles)
    block_n: int = 128  # output features per program
    block_k: int = 64  # contraction step
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")


def default_tuning(pairs: int, n_in: int, n_out: int,
                   groups: int = 1, quant_group: int | None = None
                   ) -> GroupedMatmulTuning:
    """Row tiles about one group's expected rows (``pairs / groups``, 16 to
    64: each tile reads its expert's whole weight block, so tiles much
    smaller than a group read it several times); the largest power-of-two
    blocks that divide the shapes (and 4-bit weights' ``quant_group``
    inputs per scale, so a block has one scale row)."""
    per_group = max(1, pairs // max(groups, 1))
    block_m = min(64, max(16, 1 << (per_group - 1).bit_length()))
    return GroupedMatmulTuning(block_m=block_m, block_n=_block(n_out, 128),
                               block_k=_block(quant_group or n_in, 64))


def int4_takes(K: int, N: int, quant_group: int) -> bool:
    """Whether the kernel takes 4-bit weights [E, K, N] with
    ``quant_group`` inputs per scale: each block of 32 or more inputs (two
    dots of 16) must lie in one scale group."""
    return (N % 16 == 0 and quant_group % 32 == 0 and K % quant_group == 0)


def _block(n: int, want: int) -> int:
    b = want
    while b > 16 and n % b:
        b //= 2
    return b


def num_tiles(pairs: int, groups: int, block_m: int) -> int:
    """Row tiles enough for ``pairs`` rows in up to ``groups`` groups, each
    group's run padded to whole tiles."""
    return cdiv(pairs, block_m) + min(groups, pairs)


def tile_layout(group_of: jax.Array,  # [P] int32 group of each pair; >= G: none
                groups: int, block_m: int
                ) -> tuple[jax.Array, jax.Array]:
    """(row [P] int32: each pair's row in the tiled layout, or the dummy
    row ``tiles * block_m`` for a pair in no group; tile_group [tiles]
    int32: each tile's group or -1)."""
    P = group_of.shape[0]
    tiles = num_tiles(P, groups, block_m)
    here = group_of < groups
    g = jnp.where(here, group_of, groups)
    sizes = jnp.bincount(g, length=groups + 1)[:groups]  # [G]
    padded = cdiv(sizes, block_m) * block_m
    start = jnp.cumsum(padded) - padded  # first row of each group
    order = jnp.argsort(g, stable=True)
    sorted_g = g[order]
    first_sorted = jnp.cumsum(sizes) - sizes  # group's first sorted index
    rank = jnp.arange(P) - first_sorted[jnp.minimum(sorted_g, groups - 1)]
    row_sorted = jnp.where(sorted_g < groups,
                           start[jnp.minimum(sorted_g, groups - 1)] + rank,
                           tiles * block_m)
    row = jnp.zeros(P, jnp.int32).at[order].set(row_sorted.astype(jnp.int32))
    # Tile t belongs to the group whose padded run holds its first row.
    ends = jnp.cumsum(padded)
    tile_start = jnp.arange(tiles, dtype=jnp.int32) * block_m
    tile_group = jnp.searchsorted(ends, tile_start, side="right")
    tile_group = jnp.where(tile_group < groups, tile_group, -1).astype(jnp.int32)
    return row, tile_group


def _dot(a, b):
    return jax.lax.dot(a, b, preferred_element_type=jnp.float32)


def _float_product(g: jax.Array, x_refs: tuple, w_refs: list[tuple],
                   block_k: int) -> list[jax.Array]:
    """Row tile x times group g's block of each weight, float32 [bm, bn]
    each; ``w_refs`` holds (w [E, K, bn],) or (codes, scale [E, bn]),
    the accumulated product then scaled by its columns' scales."""
    (x_ref,) = x_refs
    bm, K = x_ref.shape
    bn = w_refs[0][0].shape[2]

    def body(k, accs):
        cols = pl.ds(pl.multiple_of(k * block_k, block_k), block_k)
        xk = x_ref[:, cols]
        return tuple(acc + _dot(xk, w[0][g, cols, :].astype(xk.dtype))
                     for acc, w in zip(accs, w_refs))
    zeros = tuple(jnp.zeros((bm, bn), jnp.float32) for _ in w_refs)
    accs = jax.lax.fori_loop(0, K // block_k, body, zeros)
    return [acc if len(w) == 1 else acc * w[1][pl.ds(g, 1), :]
            for acc, w in zip(accs, w_refs)]


def _int4_product(g: jax.Array, x_refs: tuple, w_refs: list[tuple],
                  block_k: int, quant_group: int) -> list[jax.Array]:
    """The same for 4-bit weights, ``w_refs`` holding (packed [E, K/2, bn],
    scales [E, G, bn], zeros [E, G, bn]): each block of ``block_k`` inputs
    (one scale group) dequantized in registers, its even inputs times the
    rows' even columns plus its odd inputs times the odd ones."""
    x_even, x_odd = x_refs  # [bm, K / 2] each
    bm, Kh = x_even.shape
    bn = w_refs[0][0].shape[2]
    half = block_k // 2

    def body(k, accs):
        cols = pl.ds(pl.multiple_of(k * half, half), half)
        xe, xo = x_even[:, cols], x_odd[:, cols]
        group = pl.ds((k * block_k) // quant_group, 1)
        out = []
        for acc, (packed, scales, zeros) in zip(accs, w_refs):
            q = packed[g, cols, :].astype(jnp.int32)  # [half, bn]
            z = zeros[g, group, :].astype(jnp.int32)  # [1, bn]
            s = scales[g, group, :].astype(jnp.float32)
            lo = (((q & 0xF) - z).astype(jnp.float32) * s).astype(xe.dtype)
            hi = (((q >> 4) - z).astype(jnp.float32) * s).astype(xo.dtype)
            out.append(acc + _dot(xe, lo) + _dot(xo, hi))
        return tuple(out)
    zeros0 = tuple(jnp.zeros((bm, bn), jnp.float32) for _ in w_refs)
    return list(jax.lax.fori_loop(0, Kh // half, body, zeros0))


def _kernel(group_ref: Ref,  # [tiles] int32
            *refs: Ref,  # x parts [bm, *], weight parts [E, *, bn], o [bm, bn]
            product: Callable[..., list[jax.Array]], n_x: int, arity: int,
            act: Callable[[jax.Array], jax.Array] | None) -> None:
    """One (row tile, column block): its group's product (``act(gate) *
    up`` when ``act`` is given, two weights), zeros for a tile of none."""
    g = group_ref[pl.program_id(0)]
    x_refs, w_refs, o_ref = refs[:n_x], refs[n_x:-1], refs[-1]
    weights = [w_refs[i:i + arity] for i in range(0, len(w_refs), arity)]

    @pl.when(g >= 0)
    def _():
        accs = product(g, x_refs, weights)
        y = accs[0] if act is None else act(accs[0]) * accs[1]
        o_ref[...] = y.astype(o_ref.dtype)

    @pl.when(g < 0)
    def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)


def _check(x, w, tile_group, tuning, scale=None):
    M, K = x.shape
    if isinstance(w, Int4Weights):
        E, Kh, N = w.packed.shape
        K2, G = 2 * Kh, w.scales.shape[1]
        if w.packed.dtype != jnp.uint8 or w.scales.shape != (E, G, N) \
                or w.zeros.shape != (E, G, N):
            raise GroupedMatmulShapeError(
                "4-bit weights are packed uint8 [E, K/2, N] with scales "
                f"and zeros [E, G, N]; got {w.packed.dtype} {w.packed.shape}, "
                f"{w.scales.shape}, {w.zeros.shape}")
        if K2 % G or (K2 // G) % tuning.block_k or tuning.block_k < 32:
            raise GroupedMatmulShapeError(
                f"block_k={tuning.block_k} must be at least 32 and divide "
                f"the {K2 // max(G, 1)} inputs of each of the {G} scale groups")
    else:
        E, K2, N = w.shape
        if scale is None and w.dtype in (jnp.int8, jnp.float8_e4m3fn):
            raise GroupedMatmulShapeError(
                f"{w.dtype} weights for {x.dtype} rows need their scales "
                "([E, N] float32, one per group and output)")
        if scale is not None and scale.shape != (E, N):
            raise GroupedMatmulShapeError(
                f"scales {scale.shape} must be [E, N] = {(E, N)}")
    if K2 != K:
        raise GroupedMatmulShapeError(
            f"weights [E, K, N] contract over {K2}, x has {K}")
    if M != tile_group.shape[0] * tuning.block_m:
        raise GroupedMatmulShapeError(
            f"x has {M} rows; tile_group's {tile_group.shape[0]} tiles of "
            f"block_m={tuning.block_m} need {tile_group.shape[0] * tuning.block_m}")
    if K % tuning.block_k or N % tuning.block_n:
        raise GroupedMatmulShapeError(
            f"block_k={tuning.block_k} must divide K={K} and "
            f"block_n={tuning.block_n} must divide N={N}")


def _call(x: jax.Array, weights: list, scales: list | None,
          tile_group: jax.Array, tuning: GroupedMatmulTuning,
          interpret: bool, name: str,
          act: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """The pallas_call over (row tiles, column blocks) for one weight or
    two (gate and up, with ``act``), all float, all codes with ``scales``
    or all ``Int4Weights``."""
    M, K = x.shape
    bm, bn = tuning.block_m, tuning.block_n
    tiles = tile_group.shape[0]
    xs: tuple[jax.Array, ...]
    if isinstance(weights[0], Int4Weights):
        xs = (x[:, 0::2], x[:, 1::2])
        parts = [p for w in weights for p in w]
        arity = 3
        quant_group = K // weights[0].scales.shape[1]
        product = functools.partial(_int4_product, block_k=tuning.block_k,
                                    quant_group=quant_group)
    else:
        xs = (x,)
        parts = [p for i, w in enumerate(weights)
                 for p in ((w,) if scales is None else (w, scales[i]))]
        arity = 1 if scales is None else 2
        product = functools.partial(_float_product, block_k=tuning.block_k)
    N = parts[0].shape[-1]

    def column_block(a):  # [E, ..., N] -> every E and middle, bn columns
        block = a.shape[:-1] + (bn,)
        return pl.BlockSpec(block, lambda i, j: (0,) * (a.ndim - 1) + (j,))
    return pl.pallas_call(
        functools.partial(_kernel, product=product, n_x=len(xs), arity=arity,
                          act=act),
        grid=(tiles, N // bn),
        in_specs=[pl.BlockSpec((tiles,), lambda i, j: (0,)),
                  *[pl.BlockSpec((bm, a.shape[1]), lambda i, j: (i, 0))
                    for a in xs],
                  *[column_block(a) for a in parts]],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=tuning.num_warps,
                                             num_stages=tuning.num_stages),
        interpret=interpret,
        name=name,
    )(tile_group, *xs, *parts)


@functools.partial(jax.jit, static_argnames=("tuning", "interpret"))
def grouped_matmul(x: jax.Array,  # [tiles * bm, K] in tile layout
                   w: jax.Array | Int4Weights,  # [E, K, N] (or codes)
                   tile_group: jax.Array,  # [tiles] int32, -1: no group
                   scale: jax.Array | None = None,  # [E, N] f32 for codes
                   *, tuning: GroupedMatmulTuning,
                   interpret: bool = False) -> jax.Array:  # [tiles * bm, N]
    """Each row tile times its group's weights (zeros for tiles of none):
    float, int8 / fp8 codes with ``scale``, or ``Int4Weights``."""
    _check(x, w, tile_group, tuning, scale)
    return _call(x, [w], None if scale is None else [scale], tile_group,
                 tuning, interpret, "grouped_matmul")


@functools.partial(jax.jit, static_argnames=("act", "tuning", "interpret"))
def grouped_gated_matmul(x: jax.Array, gate: jax.Array | Int4Weights,
                         up: jax.Array | Int4Weights,
                         tile_group: jax.Array,
                         gate_scale: jax.Array | None = None,
                         up_scale: jax.Array | None = None, *,
                         act: Callable[[jax.Array], jax.Array],
                         tuning: GroupedMatmulTuning,
                         interpret: bool = False) -> jax.Array:
    """``act(x W_gate[g]) * (x W_up[g])`` per row tile, one pass over x."""
    _check(x, gate, tile_group, tuning, gate_scale)
    _check(x, up, tile_group, tuning, up_scale)
    if isinstance(gate, Int4Weights) != isinstance(up, Int4Weights):
        raise GroupedMatmulShapeError("gate and up must be both 4-bit or neither")
    scales = None if gate_scale is None else [gate_scale, up_scale]
    return _call(x, [gate, up], scales, tile_group, tuning, interpret,
                 "grouped_gated_matmul", act=act)


def grouped_matmul_reference(x, w, tile_group, block_m, scale=None):
    """The same product with each tile's weights gathered (codes times
    their scales, 4-bit codes dequantized), in float32."""
    tiles = tile_group.shape[0]
    xt = x.reshape(tiles, block_m, -1).astype(jnp.float32)
    w = int4_floats(w) if isinstance(w, Int4Weights) else w.astype(jnp.float32)
    if scale is not None:
        w = w * scale[:, None, :]
    wt = w[jnp.maximum(tile_group, 0)]  # [tiles, K, N]
    out = jnp.einsum("tmk,tkn->tmn", xt, wt)
    out = jnp.where((tile_group >= 0)[:, None, None], out, 0.0)
    return out.reshape(tiles * block_m, -1)
