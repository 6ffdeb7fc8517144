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
columns' scales, ``x (q * s) = (x q) * s``.

Anatomy as the other kernels': kernel bodies, ``pallas_call`` builder,
jitted wrappers with a validated frozen tuning, ``jnp`` references.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .kernel_common import Ref, cdiv


class GroupedMatmulShapeError(ValueError):
    """Shapes the kernel cannot take; says what to change."""


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
                   groups: int = 1) -> GroupedMatmulTuning:
    """Row tiles about one group's expected rows (``pairs / groups``, 16 to
    64: each tile reads its expert's whole weight block, so tiles much
    smaller than a group read it several times); the largest power-of-two
    blocks that divide the shapes."""
    per_group = max(1, pairs // max(groups, 1))
    block_m = min(64, max(16, 1 << (per_group - 1).bit_length()))
    return GroupedMatmulTuning(block_m=block_m, block_n=_block(n_out, 128),
                               block_k=_block(n_in, 64))


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


def _product(g: jax.Array, x_ref: Ref, w_refs: tuple, s_refs: tuple | None,
             block_k: int) -> list[jax.Array]:
    """Row tile x_ref times group g's block of each weight in ``w_refs``
    ([E, K, bn] each), float32 [bm, bn] each, scaled by ``s_refs``
    ([E, bn] each) when the weights are codes."""
    bm = x_ref.shape[0]
    bn = w_refs[0].shape[2]
    K = x_ref.shape[1]

    def body(k, accs):
        cols = pl.ds(pl.multiple_of(k * block_k, block_k), block_k)
        xk = x_ref[:, cols]
        return tuple(acc + _dot(xk, w[g, cols, :].astype(xk.dtype))
                     for acc, w in zip(accs, w_refs))
    zeros = tuple(jnp.zeros((bm, bn), jnp.float32) for _ in w_refs)
    accs = jax.lax.fori_loop(0, K // block_k, body, zeros)
    if s_refs is None:
        return list(accs)
    return [acc * s[pl.ds(g, 1), :] for acc, s in zip(accs, s_refs)]


def _kernel(group_ref: Ref,  # [tiles] int32
            x_ref: Ref,  # [bm, K]
            *refs: Ref,  # w [E, K, bn], (scale [E, bn],) o [bm, bn]
            block_k: int, scaled: bool) -> None:
    g = group_ref[pl.program_id(0)]
    o_ref = refs[-1]

    @pl.when(g >= 0)
    def _():
        (y,) = _product(g, x_ref, refs[:1], refs[1:2] if scaled else None,
                        block_k)
        o_ref[...] = y.astype(o_ref.dtype)

    @pl.when(g < 0)
    def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)


def _gated_kernel(group_ref: Ref, x_ref: Ref,
                  *refs: Ref,  # gate, up, (gate scale, up scale,) o
                  block_k: int, scaled: bool,
                  act: Callable[[jax.Array], jax.Array]) -> None:
    g = group_ref[pl.program_id(0)]
    o_ref = refs[-1]

    @pl.when(g >= 0)
    def _():
        a_gate, a_up = _product(g, x_ref, refs[:2],
                                refs[2:4] if scaled else None, block_k)
        o_ref[...] = (act(a_gate) * a_up).astype(o_ref.dtype)

    @pl.when(g < 0)
    def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)


def _check(x, w, tile_group, tuning, scale=None):
    M, K = x.shape
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
            f"weights [E, K, N] = {w.shape} contract over {K2}, x has {K}")
    if M != tile_group.shape[0] * tuning.block_m:
        raise GroupedMatmulShapeError(
            f"x has {M} rows; tile_group's {tile_group.shape[0]} tiles of "
            f"block_m={tuning.block_m} need {tile_group.shape[0] * tuning.block_m}")
    if K % tuning.block_k or N % tuning.block_n:
        raise GroupedMatmulShapeError(
            f"block_k={tuning.block_k} must divide K={K} and "
            f"block_n={tuning.block_n} must divide N={N}")


def _call(kernel, x, weights, scales, tile_group, tuning, interpret, name):
    M, K = x.shape
    E, _, N = weights[0].shape
    bm, bn = tuning.block_m, tuning.block_n
    tiles = tile_group.shape[0]
    w_spec = pl.BlockSpec((E, K, bn), lambda i, j: (0, 0, j))
    s_spec = pl.BlockSpec((E, bn), lambda i, j: (0, j))
    scales = tuple(scales or ())
    return pl.pallas_call(
        functools.partial(kernel, block_k=tuning.block_k, scaled=bool(scales)),
        grid=(tiles, N // bn),
        in_specs=[pl.BlockSpec((tiles,), lambda i, j: (0,)),
                  pl.BlockSpec((bm, K), lambda i, j: (i, 0)),
                  *[w_spec] * len(weights), *[s_spec] * len(scales)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=tuning.num_warps,
                                             num_stages=tuning.num_stages),
        interpret=interpret,
        name=name,
    )(tile_group, x, *weights, *scales)


@functools.partial(jax.jit, static_argnames=("tuning", "interpret"))
def grouped_matmul(x: jax.Array,  # [tiles * bm, K] in tile layout
                   w: jax.Array,  # [E, K, N] (or int8 / fp8 codes)
                   tile_group: jax.Array,  # [tiles] int32, -1: no group
                   scale: jax.Array | None = None,  # [E, N] f32 for codes
                   *, tuning: GroupedMatmulTuning,
                   interpret: bool = False) -> jax.Array:  # [tiles * bm, N]
    """Each row tile times its group's weights (zeros for tiles of none)."""
    _check(x, w, tile_group, tuning, scale)
    return _call(_kernel, x, (w,), None if scale is None else (scale,),
                 tile_group, tuning, interpret, "grouped_matmul")


@functools.partial(jax.jit, static_argnames=("act", "tuning", "interpret"))
def grouped_gated_matmul(x: jax.Array, gate: jax.Array, up: jax.Array,
                         tile_group: jax.Array,
                         gate_scale: jax.Array | None = None,
                         up_scale: jax.Array | None = None, *,
                         act: Callable[[jax.Array], jax.Array],
                         tuning: GroupedMatmulTuning,
                         interpret: bool = False) -> jax.Array:
    """``act(x W_gate[g]) * (x W_up[g])`` per row tile, one pass over x."""
    _check(x, gate, tile_group, tuning, gate_scale)
    _check(x, up, tile_group, tuning, up_scale)
    scales = None if gate_scale is None else (gate_scale, up_scale)
    return _call(functools.partial(_gated_kernel, act=act), x, (gate, up),
                 scales, tile_group, tuning, interpret, "grouped_gated_matmul")


def grouped_matmul_reference(x, w, tile_group, block_m, scale=None):
    """The same product with each tile's weights gathered (codes times
    their scales), in float32."""
    tiles = tile_group.shape[0]
    xt = x.reshape(tiles, block_m, -1).astype(jnp.float32)
    w = w.astype(jnp.float32)
    if scale is not None:
        w = w * scale[:, None, :]
    wt = w[jnp.maximum(tile_group, 0)]  # [tiles, K, N]
    out = jnp.einsum("tmk,tkn->tmn", xt, wt)
    out = jnp.where((tile_group >= 0)[:, None, None], out, 0.0)
    return out.reshape(tiles * block_m, -1)
