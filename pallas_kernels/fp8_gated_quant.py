"""The fp8 down projection's input in one pass: silu(gate) * up, quantized
per token to e4m3 (Pallas, Triton backend), for the fp8 prefill.

In a W8A8 MLP the gate and up products come out of their fp8 GEMMs unscaled
(``raw``, the activations' dtype) with a per-token scale (the MLP input's)
and per-channel weight scales. The down projection then needs
``h = silu(gate) * up`` quantized per token: its row amax, then its codes.
XLA makes that two fusions, a row reduction and a quantizing loop, each
reading both GEMM outputs: the largest work around the fp8 prefill's GEMMs
(NOTES.md, "fp8 gated quantizer"). Here each
program loads its rows' gate and up once (each row padded to a power of
two, the padding masked), scales them, takes the row's amax and writes the
codes and the row's scale: one read of both products and one write.

The math stays in float32 from the GEMM outputs to the codes, where the
unfused path rounds the projections' outputs and silu(gate) * up to the
model's dtype first: the codes differ from it where those roundings move
them, and are as close to the float model (tests/models/test_fp8_gated_mlp.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .kernel_common import Ref

FP8_DTYPE = jnp.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1e-12  # an all-zero row keeps a scale > 0 (its codes are 0)
# Widest row one program holds (two f32 rows in registers): llama3-70b's
# 28672 pads to 32768.
MAX_WIDTH = 32768
# Rows per program: the rows share one load of the column scales. Four is
# the tuned value (eight unrolled rows outgrow the registers). A T that 4
# does not divide halves it (_rows_per_program).
ROWS_PER_PROGRAM = 4


def takes(width: int) -> bool:
    """Whether a row of ``width`` fits one program."""
    return 0 < width <= MAX_WIDTH


def _num_warps(padded: int) -> int:
    # About 32 elements of each row per thread.
    return max(4, min(16, padded // 1024))


def _kernel_row(
    g_ref: Ref,  # [F] this row's unscaled gate
    u_ref: Ref,  # [F] this row's unscaled up
    gr_ref: Ref,  # [1] f32 the row's gate scale
    ur_ref: Ref,  # [1] f32 the row's up scale
    gc_ref: Ref,  # [F] f32 gate column scales
    uc_ref: Ref,  # [F] f32 up column scales
    q_ref: Ref,  # [F] e4m3 codes out
    s_ref: Ref,  # [1] f32 the row's scale out
    *, width: int, padded: int,
) -> None:
    """One row per program (v2; what a T not divisible by 2 takes)."""
    from jax.experimental.pallas import triton as plgpu
    col = jnp.arange(padded)
    mask = col < width

    def load(ref: Ref) -> jax.Array:
        return plgpu.load(ref.at[col], mask=mask, other=0).astype(jnp.float32)

    g = load(g_ref) * gr_ref[...].astype(jnp.float32) * load(gc_ref)
    u = load(u_ref) * ur_ref[...].astype(jnp.float32) * load(uc_ref)
    h = g * jax.nn.sigmoid(g) * u
    scale = jnp.maximum(jnp.max(jnp.abs(h)) / FP8_MAX, MIN_SCALE)
    codes = jnp.clip(h / scale, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)
    plgpu.store(q_ref.at[col], codes, mask=mask)
    s_ref[...] = jnp.broadcast_to(scale, (1,))


def _kernel_rows(
    g_ref: Ref,  # [T * F] unscaled gate, flattened
    u_ref: Ref,  # [T * F] unscaled up, flattened
    gr_ref: Ref,  # [rows] f32 this program's gate row scales
    ur_ref: Ref,  # [rows] f32 up row scales
    gc_ref: Ref,  # [F] f32 gate column scales
    uc_ref: Ref,  # [F] f32 up column scales
    q_ref: Ref,  # [T * F] e4m3 codes out
    s_ref: Ref,  # [rows] f32 row scales out
    *, width: int, padded: int, rows: int,
) -> None:
    """``rows`` rows of the flattened [T * F] inputs: the column scales are
    loaded once for them all (they are as many bytes as a row of gate and
    up together, read from L2 by every program). The default, at
    ROWS_PER_PROGRAM rows."""
    from jax.experimental.pallas import triton as plgpu
    col = jnp.arange(padded)
    mask = col < width

    def load(ref: Ref, at: jax.Array) -> jax.Array:
        return plgpu.load(ref.at[at], mask=mask, other=0).astype(jnp.float32)
    gc, uc = load(gc_ref, col), load(uc_ref, col)
    lane = jnp.arange(rows)
    g_rows = gr_ref[...].astype(jnp.float32)  # [rows]
    u_rows = ur_ref[...].astype(jnp.float32)
    scales = jnp.zeros((rows,), jnp.float32)
    for r in range(rows):  # unrolled: static offsets
        pick = lane == r
        g = load(g_ref, r * width + col) * jnp.sum(jnp.where(pick, g_rows, 0)) * gc
        u = load(u_ref, r * width + col) * jnp.sum(jnp.where(pick, u_rows, 0)) * uc
        h = g * jax.nn.sigmoid(g) * u
        scale = jnp.maximum(jnp.max(jnp.abs(h)) / FP8_MAX, MIN_SCALE)
        codes = jnp.clip(h / scale, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)
        plgpu.store(q_ref.at[r * width + col], codes, mask=mask)
        scales = jnp.where(pick, scale, scales)
    s_ref[...] = scales


def _rows_per_program(T: int, rows: int | None) -> int:
    rows = rows or ROWS_PER_PROGRAM
    while rows > 1 and T % rows:
        rows //= 2
    return rows


@functools.partial(jax.jit, static_argnames=("interpret", "num_warps", "rows"))
def silu_mul_quantize(
    gate_raw: jax.Array,  # [T, F]
    up_raw: jax.Array,  # [T, F]
    gate_row_scale: jax.Array,  # [T, 1] f32
    up_row_scale: jax.Array,  # [T, 1] f32
    gate_col_scale: jax.Array,  # [F] f32
    up_col_scale: jax.Array,  # [F] f32
    *,
    interpret: bool = False,
    num_warps: int | None = None,
    rows: int | None = None,
) -> tuple[jax.Array, jax.Array]:  # codes e4m3 [T, F], scale f32 [T, 1]
    """gate_raw, up_raw [T, F] (unscaled GEMM outputs); *_row_scale [T, 1]
    f32; *_col_scale [F] f32 -> (codes e4m3 [T, F], scale f32 [T, 1]) with
    silu(gate) * up ~= codes * scale, gate = raw * row * col computed in
    float32. ``rows``: rows per program (a power of two dividing T, else
    halved)."""
    T, F = gate_raw.shape
    if not takes(F):
        raise ValueError(f"silu_mul_quantize takes rows of at most "
                         f"{MAX_WIDTH} elements, got {F}")
    padded = pl.next_power_of_2(F)
    R = _rows_per_program(T, rows)
    compiler_params = None
    if not interpret:
        from jax.experimental.pallas import triton as plgpu
        compiler_params = plgpu.CompilerParams(
            num_warps=num_warps or _num_warps(padded))
    gr = jnp.broadcast_to(gate_row_scale.astype(jnp.float32), (T, 1))
    ur = jnp.broadcast_to(up_row_scale.astype(jnp.float32), (T, 1))
    gc = jnp.broadcast_to(gate_col_scale.astype(jnp.float32), (F,))
    uc = jnp.broadcast_to(up_col_scale.astype(jnp.float32), (F,))
    per_col = pl.BlockSpec((F,), lambda i: (0,))
    out_shape = [jax.ShapeDtypeStruct((T, F), FP8_DTYPE),
                 jax.ShapeDtypeStruct((T, 1), jnp.float32)]
    if R == 1:
        row = pl.BlockSpec((None, F), lambda i: (i, 0))
        per_row = pl.BlockSpec((None, 1), lambda i: (i, 0))
        return pl.pallas_call(
            functools.partial(_kernel_row, width=F, padded=padded),
            grid=(T,), in_specs=[row, row, per_row, per_row, per_col, per_col],
            out_specs=[row, per_row], out_shape=out_shape,
            interpret=interpret, name="fp8_silu_mul_quantize",
            compiler_params=compiler_params,
        )(gate_raw, up_raw, gr, ur, gc, uc)
    block = pl.BlockSpec((R * F,), lambda i: (i,))
    per_row = pl.BlockSpec((R,), lambda i: (i,))
    codes, scale = pl.pallas_call(
        functools.partial(_kernel_rows, width=F, padded=padded, rows=R),
        grid=(T // R,),
        in_specs=[block, block, per_row, per_row, per_col, per_col],
        out_specs=[block, per_row],
        out_shape=[jax.ShapeDtypeStruct((T * F,), FP8_DTYPE),
                   jax.ShapeDtypeStruct((T,), jnp.float32)],
        interpret=interpret, name="fp8_silu_mul_quantize_rows",
        compiler_params=compiler_params,
    )(gate_raw.reshape(T * F), up_raw.reshape(T * F), gr.reshape(T),
      ur.reshape(T), gc, uc)
    return codes.reshape(T, F), scale.reshape(T, 1)


def silu_mul_quantize_reference(gate_raw, up_raw, gate_row_scale,
                                up_row_scale, gate_col_scale, up_col_scale,
                                dtype=jnp.bfloat16):
    """The unfused path's math (XLA ops): the projections' outputs in
    ``dtype``, silu(gate) * up in ``dtype``, then per-token e4m3."""
    gate = (gate_raw.astype(jnp.float32) * gate_row_scale
            * gate_col_scale).astype(dtype)
    up = (up_raw.astype(jnp.float32) * up_row_scale * up_col_scale).astype(dtype)
    h = (jax.nn.silu(gate) * up).astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(h), axis=-1, keepdims=True) / FP8_MAX,
                        MIN_SCALE)
    codes = jnp.clip(h / scale, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)
    return codes, scale
