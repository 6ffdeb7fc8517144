"""Pieces the attention kernels share: constants, the prefill work-item split,
and the Mosaic GPU helpers both Mosaic kernels use."""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

# A kernel body's memory reference (a Pallas ref, or a view of one through
# ``.at``); jax exports no type for it that its own signatures use.
Ref = Any

# A finite "minus infinity": masked logits stay finite, so a row with every
# entry masked gives zeros instead of NaNs.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
LOG2E = math.log2(math.e)  # the kernels' softmax runs in base 2
TABLE_PIECE = 256  # a TMA box holds at most 256 elements along a dimension


@functools.cache
def hopper() -> bool:
    """Whether the default device is a Hopper GPU (compute capability 9.x:
    TMA and wgmma) with Mosaic GPU importable."""
    import jax
    try:
        dev = jax.devices()[0]
        importlib.import_module("jax.experimental.pallas.mosaic_gpu")
    except Exception:  # noqa: BLE001 - no device / no Mosaic GPU
        return False
    cc = getattr(dev, "compute_capability", None)
    return (dev.platform == "gpu" and cc is not None
            and 9.0 <= float(cc) < 10.0)


def cdiv(x, m):
    """Ceiling division (Python ints or traced int arrays alike)."""
    return -(-x // m)


def round_up(x, m):
    """``x`` rounded up to a multiple of ``m``."""
    return cdiv(x, m) * m


def table_pieces(table_chunk: int) -> tuple[int, int]:
    """(pieces, elements per piece) of a block-table slice copied by TMA."""
    num = table_chunk // TABLE_PIECE if table_chunk > TABLE_PIECE else 1
    return num, table_chunk // num


def sequence_work_items(
    base: jax.Array,  # [S] int32 first row of each sequence
    end: jax.Array,  # [S] int32 row past the last
    eligible: jax.Array,  # [S] bool
    tile: int,
    num_items: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Splits the rows [base[s], end[s]) of every eligible sequence into
    ``tile``-row items, the last (heaviest, causal) item of each sequence
    first: (item_seq [I], item_start [I] = -1 past the last item, the number
    of items used)."""
    nblk = jnp.where(eligible, cdiv(end - base, tile), 0)
    ends = jnp.cumsum(nblk)
    i = jnp.arange(num_items, dtype=jnp.int32)
    # compare_all: one fused [I, S] comparison (the default binary search is
    # a loop, which XLA on GPU runs as a while loop with a host round trip
    # per iteration).
    seq = jnp.searchsorted(ends, i, side="right",
                           method="compare_all").astype(jnp.int32)
    seq = jnp.minimum(seq, base.shape[0] - 1)
    blk = ends[seq] - 1 - i
    start = jnp.where(i < ends[-1], base[seq] + blk * tile, -1)
    return seq, start.astype(jnp.int32), ends[-1]


def per_tensor_scales(k_scale: jax.typing.ArrayLike | None = None,
                      v_scale: jax.typing.ArrayLike | None = None
                      ) -> jax.Array:  # [2] f32
    """[2] f32 (k, v) from two optional scalar scales (None = 1), as the
    kernels read them at run time."""
    return jnp.stack([
        jnp.asarray(1.0 if x is None else x, jnp.float32).reshape(())
        for x in (k_scale, v_scale)])


def mosaic_register_helpers(interpret: bool
                            ) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(cast, iota) for Mosaic GPU kernel bodies: register layouts mean
    nothing in jax's GPU interpreter, so there both are plain jnp."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def cast(x, layout):
        return x if interpret else plgpu.layout_cast(x, layout)

    def iota(shape, dim):
        if interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim,
                                      layout=plgpu.Layout.WGMMA)

    return cast, iota


def mosaic_matmul_helpers(interpret: bool
                          ) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(qk, pv), the two tensor-core products of a flash step in a Mosaic GPU
    kernel body, with their interpret-mode stand-ins (jax's GPU interpreter
    takes no transposed or register wgmma operand):

    * ``qk(q_ref, k_ref, shape, then)``: f32 logits ``q @ k^T`` of two smem
      tiles, ``shape`` = (rows, tokens); ``then()`` runs after the wgmma is
      issued, before its result is read (a schedule barrier, say, or other
      register work the wgmma overlaps); ``qk(..., then, with_result=True)``
      returns ``(logits, then())``;
    * ``pv(acc, p, v_ref)``: ``acc + p @ v`` with p in registers."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def qk(q_ref, k_ref, shape, then=lambda: None, with_result=False):
        if interpret:  # in f32, as the tensor cores accumulate
            s = lax.dot_general(q_ref[...].astype(jnp.float32),
                                k_ref[...].astype(jnp.float32),
                                (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
            r = then()
            return (s, r) if with_result else s

        def body(acc_ref):
            plgpu.wgmma(acc_ref, q_ref, k_ref.transpose((1, 0)))
            r = then()
            s = acc_ref[...]  # waits for the wgmma
            return (s, r) if with_result else s
        return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))

    def pv(acc, p, v_ref):
        if interpret:
            return acc + lax.dot_general(p.astype(jnp.float32),
                                         v_ref[...].astype(jnp.float32),
                                         (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)

        def body(acc_ref):
            plgpu.wgmma(acc_ref, p, v_ref)
        return pl.run_state(body)(plgpu.ACC.init(acc))

    return qk, pv


def mosaic_interpret_params(**kw: Any) -> Any:
    """Parameters of jax's Mosaic GPU interpreter (the CPU test path).

    jax exports no public name for them (its own tests import this same
    private module); kept in this one place so a jax upgrade that moves
    them touches one line. Compiled kernels never reach it."""
    from jax._src.pallas.mosaic_gpu.interpret import params
    return params.InterpretGPUParams(**kw)


def swizzled_smem_transforms(dtype: jax.typing.DTypeLike, swizzle: int = 128
                             ) -> tuple[Any, Any]:
    """Tiling + swizzle (128 bytes unless a row is narrower) of a
    shared-memory tile that wgmma or a tiled register load reads."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle))


def mosaic_operand_problem(q_dtype: jax.typing.DTypeLike,
                           kv_dtype: jax.typing.DTypeLike,
                           head_dim: int) -> str | None:
    """What both Mosaic GPU kernels refuse in their operands (wgmma takes
    16-bit operands; pages are read in the query dtype; the swizzled tiles
    cover head dims 64/128/256), or None."""
    if jnp.dtype(q_dtype) not in (jnp.dtype(jnp.bfloat16),
                                  jnp.dtype(jnp.float16)):
        return f"query dtype {jnp.dtype(q_dtype).name} (wgmma: bf16/f16)"
    if jnp.dtype(kv_dtype) != jnp.dtype(q_dtype):
        return f"page dtype {jnp.dtype(kv_dtype).name} != query dtype"
    if head_dim not in (64, 128, 256):
        return f"head_dim {head_dim} (64/128/256)"
    return None
