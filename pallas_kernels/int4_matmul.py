"""int4 x bf16 matmul with the weights dequantized in registers (Pallas,
Triton lowering; interpret mode on CPU), for AWQ / GPTQ layers, and the
public entry point that picks between it and the Mosaic GPU kernel of
``int4_matmul_mgpu.py`` (Hopper, bf16 activations, groups of 128).

Weights in the layout of ``models/quantization``'s ``GroupedWeights``:
``qweight`` uint8 [Out, In / 2] (input 2j in the low nibble of byte j, 2j + 1
in the high one), ``scales`` [Out, G] and ``qzeros`` uint8 [Out, G], groups
of ``In / G`` inputs; ``w[o, i] = (q[o, i] - z[o, g]) * s[o, g]``.

Why it is built this way: the low and high nibbles of a byte are inputs of
the same group, so the activations are split once (outside, in XLA) into
their even and odd inputs, and each byte tile feeds two dots, one per
nibble, with no interleave inside the kernel. A loop step covers one
group (``In / G / 2`` bytes of every row of the tile), so its scale and zero
are one column broadcast along the tile. Small batches (decode) split the
groups over several programs (split-K) and sum their partial products.

Anatomy as the attention kernels': kernel body, ``pallas_call`` builder, a
jitted wrapper with a validated frozen tuning, a ``jnp`` reference.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .int4_matmul_mgpu import Int4MosaicTuning, int4_matmul_mgpu
from .int4_matmul_mgpu import problem as mosaic_problem
from .kernel_common import Ref, hopper

# Rows up to which ``int4_matmul`` with no tuning runs the Mosaic kernel on
# Hopper (for the cases it takes); the Triton kernel serves the rest. Up to
# here the Mosaic kernel is the faster of the two at llama3-8b's projection
# shapes; past it a batch is compute-bound and XLA's dot takes over
# (models/quantization/methods.py, INT4_KERNEL_MAX_ROWS).
MOSAIC_MAX_ROWS = 256


class Int4MatmulShapeError(ValueError):
    """Shapes the kernel cannot take; says what to change."""


@dataclasses.dataclass(frozen=True)
class Int4MatmulTuning:
    block_m: int = 16  # rows of x per program (>= 16: tensor-core tiles)
    block_n: int = 64  # output features per program
    splits: int = 4  # programs sharing one tile's groups (split-K)
    num_warps: int = 4
    num_stages: int = 2
    # "weights": dequantize each code to (q - z) * s before its dot (two
    # multiplies per weight); "partials": dot the raw codes, then apply the
    # group's zero point and scale to the [bm, bn] partial product, as
    # s * (x . q - z * sum(x)) with sum(x) per group computed outside (no
    # per-weight arithmetic but the nibble's mask and convert).
    scale_on: str = "weights"

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        if self.splits < 1:
            raise ValueError(f"splits must be >= 1, got {self.splits}")
        if self.scale_on not in ("weights", "partials"):
            raise ValueError(f"scale_on must be 'weights' or 'partials', "
                             f"got {self.scale_on!r}")


def _dot_nt(a, b):
    """a [m, k] . b [n, k] -> [m, n] f32 (the attention kernels' form)."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _kernel(
    x_even_ref: Ref,  # [bm, In / 2] inputs 0, 2, 4, ...
    x_odd_ref: Ref,  # [bm, In / 2] inputs 1, 3, 5, ...
    q_ref: Ref,  # [bn, In / 2] uint8 codes, two per byte
    s_ref: Ref,  # [bn, G] scales
    z_ref: Ref,  # [bn, G] uint8 zero points
    o_ref: Ref,  # [bm, bn] f32 this split's partial product
    *, groups_per_split: int, group_bytes: int) -> None:
    split = pl.program_id(2)
    bm, bn = o_ref.shape

    def body(g, acc):
        gi = split * groups_per_split + g
        cols = pl.ds(gi * group_bytes, group_bytes)
        q = q_ref[:, cols]  # [bn, group_bytes]
        s = s_ref[:, pl.ds(gi, 1)].astype(jnp.float32)  # [bn, 1]
        z = z_ref[:, pl.ds(gi, 1)].astype(jnp.float32)
        lo = (((q & 0xF).astype(jnp.float32) - z) * s).astype(x_even_ref.dtype)
        hi = (((q >> 4).astype(jnp.float32) - z) * s).astype(x_even_ref.dtype)
        acc += _dot_nt(x_even_ref[:, cols], lo)
        acc += _dot_nt(x_odd_ref[:, cols], hi)
        return acc

    o_ref[...] = jax.lax.fori_loop(0, groups_per_split, body,
                                   jnp.zeros((bm, bn), jnp.float32))


def _kernel_scale_partials(
    x_even_ref: Ref,  # [bm, In / 2] inputs 0, 2, 4, ...
    x_odd_ref: Ref,  # [bm, In / 2] inputs 1, 3, 5, ...
    xsum_ref: Ref,  # [bm, G] f32 sum of each group's inputs
    q_ref: Ref,  # [bn, In / 2] uint8 codes, two per byte
    s_ref: Ref,  # [G, bn] scales (transposed: a group's scales are one row)
    z_ref: Ref,  # [G, bn] uint8 zero points (transposed)
    o_ref: Ref,  # [bm, bn] f32 this split's partial product
    *, groups_per_split: int, group_bytes: int) -> None:
    split = pl.program_id(2)
    bm, bn = o_ref.shape
    dt = x_even_ref.dtype

    def body(g, acc):
        gi = split * groups_per_split + g
        cols = pl.ds(gi * group_bytes, group_bytes)
        q = q_ref[:, cols]  # [bn, group_bytes]
        # Codes 0..15 are exact in every float dtype the kernel takes.
        dots = (_dot_nt(x_even_ref[:, cols], (q & 0xF).astype(dt))
                + _dot_nt(x_odd_ref[:, cols], (q >> 4).astype(dt)))
        s = s_ref[pl.ds(gi, 1), :].astype(jnp.float32)  # [1, bn]
        z = z_ref[pl.ds(gi, 1), :].astype(jnp.float32)
        return acc + s * (dots - z * xsum_ref[:, pl.ds(gi, 1)])

    o_ref[...] = jax.lax.fori_loop(0, groups_per_split, body,
                                   jnp.zeros((bm, bn), jnp.float32))


def _call(x_even, x_odd, qweight, scales, qzeros, tuning, interpret):
    M = x_even.shape[0]
    G = scales.shape[1]
    if tuning.scale_on == "partials":
        xsum = (x_even.astype(jnp.float32) + x_odd.astype(jnp.float32)
                ).reshape(M, G, -1).sum(axis=-1)
        return partials_call(x_even, x_odd, xsum, qweight, scales.T, qzeros.T,
                             tuning, interpret)
    half = x_even.shape[1]
    bm, bn = tuning.block_m, tuning.block_n
    x_spec = pl.BlockSpec((bm, half), lambda i, j, k: (i, 0))
    group_cols = pl.BlockSpec((bn, G), lambda i, j, k: (j, 0))
    kernel = functools.partial(_kernel, groups_per_split=G // tuning.splits,
                               group_bytes=half // G)
    return _pallas_call(kernel, (x_even, x_odd, qweight, scales, qzeros),
                        [x_spec, x_spec, _q_spec(half, bn), group_cols,
                         group_cols], M, scales.shape[0], tuning, interpret)


def partials_call(x_even, x_odd, xsum, qweight, scales_t, qzeros_t, tuning,
                  interpret=False):
    """The partials form's ``pallas_call`` on inputs already prepared: the
    groups' input sums [M, G] and the transposed scales and zero points
    [G, Out] (``_call`` makes them in XLA; a benchmark can time the kernel
    without them). Returns the splits' partial products [splits, M, Out]."""
    M, half = x_even.shape
    G, n_out = scales_t.shape
    bm, bn = tuning.block_m, tuning.block_n
    x_spec = pl.BlockSpec((bm, half), lambda i, j, k: (i, 0))
    group_rows = pl.BlockSpec((G, bn), lambda i, j, k: (0, j))
    kernel = functools.partial(_kernel_scale_partials,
                               groups_per_split=G // tuning.splits,
                               group_bytes=half // G)
    return _pallas_call(
        kernel, (x_even, x_odd, xsum, qweight, scales_t, qzeros_t),
        [x_spec, x_spec, pl.BlockSpec((bm, G), lambda i, j, k: (i, 0)),
         _q_spec(half, bn), group_rows, group_rows], M, n_out, tuning,
        interpret)


def _q_spec(half, bn):
    return pl.BlockSpec((bn, half), lambda i, j, k: (j, 0))


def _pallas_call(kernel, args, in_specs, M, n_out, tuning, interpret):
    bm, bn, splits = tuning.block_m, tuning.block_n, tuning.splits
    return pl.pallas_call(
        kernel,
        grid=(M // bm, n_out // bn, splits),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bm, bn), lambda i, j, k: (k, i, j)),
        out_shape=jax.ShapeDtypeStruct((splits, M, n_out), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=tuning.num_warps,
                                             num_stages=tuning.num_stages),
        interpret=interpret,
        name="int4_matmul",
    )(*args)


def _check(x, qweight, scales, qzeros, tuning):
    M, n_in = x.shape
    n_out, half = qweight.shape
    G = scales.shape[1]
    if half * 2 != n_in:
        raise Int4MatmulShapeError(
            f"qweight {qweight.shape} holds {2 * half} inputs, x has {n_in}")
    if scales.shape != (n_out, G) or qzeros.shape != (n_out, G):
        raise Int4MatmulShapeError(
            f"scales {scales.shape} and qzeros {qzeros.shape} must both be "
            f"[{n_out}, groups]")
    group_bytes = half // G if G else 0
    if G == 0 or half % G or group_bytes % 16:
        raise Int4MatmulShapeError(
            f"{n_in} inputs in {G} groups: a group must be a multiple of 32 "
            "inputs (16 bytes, a tensor-core K)")
    if G % tuning.splits:
        raise Int4MatmulShapeError(
            f"splits={tuning.splits} must divide the {G} groups")
    if n_out % tuning.block_n:
        raise Int4MatmulShapeError(
            f"block_n={tuning.block_n} must divide the {n_out} outputs")


def takes(n_in: int, n_out: int, groups: int, M: int = 1) -> bool:
    """Whether the kernel takes these shapes with its default tuning (the
    model falls back to XLA's product where it does not)."""
    try:
        _check(jax.ShapeDtypeStruct((M, n_in), jnp.float32),
               jax.ShapeDtypeStruct((n_out, n_in // 2), jnp.uint8),
               jax.ShapeDtypeStruct((n_out, groups), jnp.float16),
               jax.ShapeDtypeStruct((n_out, groups), jnp.uint8),
               default_tuning(M, n_out, groups))
    except Int4MatmulShapeError:
        return False
    return n_in % 2 == 0


def default_tuning(M: int, n_out: int, groups: int) -> Int4MatmulTuning:
    """The Triton kernel's tuned launch for M rows (swept by
    benchmarks/kernels/bench_int4.py over llama3-8b's four projection
    shapes). Up to 16 rows: row blocks of 16, 64 outputs, the groups split
    over 8 programs (a decode has too few output tiles to fill the GPU
    otherwise), scales applied to each group's partial product. Larger
    batches: row blocks of 128 (64 up to 64 rows), no split, scales on the
    weights (the partials form is slower there)."""
    if M <= 16:
        splits = max(d for d in (8, 4, 2, 1) if groups % d == 0)
        return Int4MatmulTuning(block_m=16, block_n=_block_n(n_out, 64),
                                splits=splits, num_warps=4, num_stages=3,
                                scale_on="partials")
    return Int4MatmulTuning(block_m=64 if M <= 64 else 128,
                            block_n=_block_n(n_out, 64), splits=1,
                            num_warps=4, num_stages=3, scale_on="weights")


def _block_n(n_out: int, want: int) -> int:
    """The largest power of two <= ``want`` dividing ``n_out`` (>= 16)."""
    b = want
    while b > 16 and n_out % b:
        b //= 2
    return b


def uses_mosaic(x_dtype: jax.typing.DTypeLike, n_in: int, n_out: int,
                groups: int, scale_dtype: jax.typing.DTypeLike, M: int,
                interpret: bool = False) -> bool:
    """Whether ``int4_matmul`` with no tuning runs the Mosaic GPU kernel:
    on Hopper, compiled, up to ``MOSAIC_MAX_ROWS`` rows, for the cases it
    takes."""
    return (not interpret and M <= MOSAIC_MAX_ROWS and hopper()
            and mosaic_problem(x_dtype, n_in, n_out, groups, scale_dtype)
            is None)


@functools.partial(jax.jit, static_argnames=("tuning", "interpret"))
def int4_matmul(
    x: jax.Array,  # [M, In] bf16 / f16 / f32
    qweight: jax.Array,  # [Out, In / 2] uint8
    scales: jax.Array,  # [Out, G]
    qzeros: jax.Array,  # [Out, G] uint8
    *,
    tuning: Int4MatmulTuning | Int4MosaicTuning | None = None,
    interpret: bool = False,
) -> jax.Array:  # [M, Out] in x's dtype
    """``tuning`` picks the kernel: an ``Int4MosaicTuning`` the Mosaic GPU
    kernel (``int4_matmul_mgpu.py``; raises ``Int4MosaicUnsupported`` for
    cases it does not take), an ``Int4MatmulTuning`` the Triton one, None
    the Mosaic kernel where ``uses_mosaic`` says so, else the Triton kernel
    with ``default_tuning``."""
    M = x.shape[0]
    n_out, groups = scales.shape
    if tuning is None:
        tuning = (Int4MosaicTuning() if uses_mosaic(
            x.dtype, x.shape[1], n_out, groups, scales.dtype, M, interpret)
            else default_tuning(M, n_out, groups))
    if isinstance(tuning, Int4MosaicTuning):
        return int4_matmul_mgpu(x, qweight, scales, qzeros, tuning=tuning,
                                interpret=interpret)
    _check(x, qweight, scales, qzeros, tuning)
    rows = -(-M // tuning.block_m) * tuning.block_m
    xp = jnp.pad(x, ((0, rows - M), (0, 0)))
    partial = _call(xp[:, 0::2], xp[:, 1::2], qweight, scales, qzeros,
                    tuning, interpret)
    return partial.sum(axis=0)[:M].astype(x.dtype)


def int4_matmul_many(
    x: jax.Array,  # [M, In]
    # (qweight [Out, In / 2], scales [Out, G], qzeros [Out, G]) of each set
    weight_sets: Sequence[tuple[jax.Array, jax.Array, jax.Array]],
    *,
    interpret: bool = False,
) -> list[jax.Array]:  # [M, Out] of each set
    """``int4_matmul(x, *set)`` for each weight set: one Mosaic kernel call
    for all of them where the Mosaic kernel would run each
    (``uses_mosaic``) and they share their group count and scale dtype,
    else one call each."""
    from .int4_matmul_mgpu import int4_matmul_mgpu_many
    M, n_in = x.shape
    firsts = weight_sets[0][1]
    if len(weight_sets) > 1 and all(
            uses_mosaic(x.dtype, n_in, s.shape[0], s.shape[1], s.dtype, M,
                        interpret)
            and s.shape[1] == firsts.shape[1] and s.dtype == firsts.dtype
            for _, s, _ in weight_sets):
        return int4_matmul_mgpu_many(x, weight_sets, interpret=interpret)
    return [int4_matmul(x, *ws, interpret=interpret) for ws in weight_sets]


def int4_matmul_reference(x, qweight, scales, qzeros):
    """x @ w.T with w dequantized in float32."""
    q = jnp.stack([qweight & 0xF, qweight >> 4], axis=-1).reshape(
        qweight.shape[0], -1).astype(jnp.float32)
    G = scales.shape[1]
    q = q.reshape(q.shape[0], G, -1)
    w = (q - qzeros.astype(jnp.float32)[..., None]) * scales.astype(
        jnp.float32)[..., None]
    return (x.astype(jnp.float32) @ w.reshape(w.shape[0], -1).T).astype(
        x.dtype)
