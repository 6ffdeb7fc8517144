"""Ragged paged attention in Pallas for NVIDIA GPUs (and interpret mode on CPU).

Same semantics as ``ragged_paged_attention_reference``: sequence ``s`` owns
query rows ``cu_q_lens[s]:cu_q_lens[s+1]`` and ``kv_lens[s]`` tokens in its
pages; query token ``i`` of ``q_len`` sits at position ``kv_len - q_len + i``
and attends causally (optionally within a sliding window); padding rows get
zeros.

A decode and a prefill kernel run on every step, each skipping the
sequences of the other:

* decode (``q_len == 1``), two kernels, one chosen per call from the platform
  and the case (``_use_mosaic_decode``):

  - Mosaic GPU (``ragged_paged_attention_mgpu.py``), the default on Hopper
    (compute capability 9.x) for bf16/f16 pages of 16 tokens, head dims
    64/128/256, GQA groups up to 64: one program per (sequence, kv head,
    split) reads each K/V page once for the whole GQA group through per-page
    TMA copies into a multi-stage smem ring (a producer warpgroup issues the
    copies, a consumer warpgroup runs wgmma + online softmax), split-KV with
    a jnp combine for small batches. Why it is the default: on one H200 (jax
    0.11.2, copy BW 4.13 TB/s, same run) it reached 3.30 TB/s (80% of copy)
    through this function at S=64 L=2048 against 2.48 TB/s (60%) for the
    Triton kernel, and 54-58% at S=1 L=32768 (the kernel alone 67%) against
    42%; see ``benchmarks/results/kernel-decode-mgpu-h200.json`` and
    NOTES.md v4. ``k_scale`` is folded into its query rows.
  - Triton (this file), everywhere else: f32 (wgmma takes 16-bit operands),
    fp8 or other page dtypes differing from q, page size 32 (the Mosaic
    kernel faults there on jax 0.11.2, cause not found yet), other GPUs, and
    interpret mode on CPU. Grid (S, K, splits); one program reads each K/V
    tile of one kv head once and serves every query head of its GQA group
    (padded to 16 rows for the tensor cores); for small batches the KV axis
    is split across programs (split count from S*K and the SM count) and a
    jnp combine step merges the partial softmaxes (flash-decoding).
  ``tuning.decode_backend`` ("auto", "mosaic", "triton") overrides the
  choice; "mosaic" with ``interpret=True`` runs the Mosaic kernel in jax's
  GPU interpreter (CPU tests).
* prefill (``q_len > 1``, chunked prefill and prefix hits alike): grid
  (N, work items), a work item being ``block_q`` query rows of one sequence;
  the program walks the sequence's pages (the cached prefix and this step's
  tokens) up to its causal limit with an online softmax on the tensor cores.

Backend of the prefill kernel: on Hopper, for the cases it takes (bf16/f16,
H 64/128, page a multiple of 8 dividing 128), the Mosaic GPU kernel of
``ragged_paged_attention_prefill_mgpu.py`` (FA3 form, one TMA copy per page):
8x2048 causal 0.640 ms = 55% of the bf16 matmul rate through this function,
0.96x cuDNN's speed for the kernel and its wrapper (NOTES.md v5). Elsewhere
(f32, H=256, other GPUs, interpret mode on CPU) Pallas' Triton lowering
(``pl.pallas_call`` + ``plgpu.CompilerParams``), which runs unchanged on jax
0.10 and 0.11 and gathers pages with pointer gathers: 263 TFLOP/s (33%) on
the same shape. ``tuning.prefill_backend`` forces either.

K/V scale hooks (fp8 pages): ``k_scale``/``v_scale`` are per-tensor scalars
(the quantization issue may widen them to per-page); the pages are upcast to
the query dtype inside the kernel, logits are multiplied by ``k_scale`` and
outputs by ``v_scale``.
"""

from __future__ import annotations

import functools
import importlib
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import ragged_paged_attention_mgpu as _mgpu
from . import ragged_paged_attention_prefill_mgpu as _pf
from .ragged_paged_attention_reference import ragged_paged_attention_reference
from .ragged_paged_attention_tuning import (RaggedPagedAttentionTuning,
                                            default_tuning)

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_LOG2E = math.log2(math.e)


class RaggedAttentionShapeError(ValueError):
    """Inputs whose shapes the kernels cannot take; says what to change."""


def _logits(q, k, sm_scale, k_scale, logit_soft_cap):
    """[R, H] x [BK, H] -> [R, BK] f32 logits, base-2 scaled."""
    s = jax.lax.dot_general(q, k.astype(q.dtype), (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
    s = s * (sm_scale * k_scale)
    if logit_soft_cap is not None:
        s = logit_soft_cap * jnp.tanh(s / logit_soft_cap)
    return s * _LOG2E


def _online_softmax_step(carry, s, v):
    """One flash step: s [R, BK] (masked, base 2), v [BK, H]."""
    o, m, l = carry
    m_next = jnp.maximum(m, s.max(axis=1))
    corr = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    l_next = corr * l + p.sum(axis=1)
    o_next = corr[:, None] * o + jax.lax.dot_general(
        p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32)
    return o_next, m_next, l_next


# ----------------------------------------------------------------- decode ---

def _decode_kernel(
    kv_lens_ref,  # [S] int32; 0 for sequences that are not decodes
    block_tables_ref,  # [P_pad] int32 this sequence's pages
    scales_ref,  # [2] f32 (k_scale, v_scale)
    q_ref,  # [Gp, H] this group's query heads (zero padded)
    k_pages_ref,  # [num_pages, B, H] this kv head
    v_pages_ref,  # [num_pages, B, H]
    o_ref,  # [Gp, H] f32 unnormalized partial output of this split
    m_ref,  # [Gp] f32 running max (base 2)
    l_ref,  # [Gp] f32 running sum
    *, sm_scale, sliding_window, logit_soft_cap, pages_per_block, num_splits,
    prefetch):
    seq, split = pl.program_id(0), pl.program_id(2)
    rows, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[1]
    bk = pages_per_block * page_size
    kv_len = kv_lens_ref[seq]
    k_scale = scales_ref[0]

    num_blocks = pl.cdiv(kv_len, bk)
    lo = 0
    if sliding_window is not None:
        lo = jnp.maximum(kv_len - sliding_window, 0) // bk
    per_split = pl.cdiv(num_blocks - lo, num_splits)
    start = lo + split * per_split
    end = jnp.minimum(start + per_split, num_blocks)
    q = q_ref[...]

    def load(b):
        pages = block_tables_ref[pl.ds(b * pages_per_block, pages_per_block)]
        return (k_pages_ref[pages].reshape(bk, head_dim),
                v_pages_ref[pages].reshape(bk, head_dim))

    def attend(b, carry, k, v, masked):
        s = _logits(q, k, sm_scale, k_scale, logit_soft_cap)
        if masked:
            kv_pos = b * bk + jnp.arange(bk, dtype=jnp.int32)
            mask = kv_pos < kv_len
            if sliding_window is not None:
                mask &= kv_pos >= kv_len - sliding_window
            s = jnp.where(mask[None, :], s, _MASK_VALUE)
        return _online_softmax_step(carry, s, v.astype(q.dtype))

    carry = (jnp.zeros((rows, head_dim), jnp.float32),
             jnp.full((rows,), _MASK_VALUE, jnp.float32),
             jnp.zeros((rows,), jnp.float32))
    if prefetch:
        # Software double buffering: the next tile's loads are issued before
        # this tile's math, so they are in flight while it runs.
        def body(b, c):
            acc, k, v = c[:3], c[3], c[4]
            k_next, v_next = load(jnp.minimum(b + 1, end - 1))
            return (*attend(b, acc, k, v, True), k_next, v_next)
        k0, v0 = load(jnp.minimum(start, jnp.maximum(end - 1, 0)))
        o, m, l, _, _ = jax.lax.fori_loop(start, end, body, (*carry, k0, v0))
    else:
        def body(b, c, masked):
            return attend(b, c, *load(b), masked)
        # Whole blocks below kv_len need no mask; only the last one (and,
        # with a window, every block) does.
        full = start if sliding_window is not None else kv_len // bk
        mid = jnp.clip(full, start, end)
        carry = jax.lax.fori_loop(start, mid,
                                  functools.partial(body, masked=False), carry)
        o, m, l = jax.lax.fori_loop(mid, end,
                                    functools.partial(body, masked=True), carry)
    o_ref[...] = o
    m_ref[...] = m
    l_ref[...] = l


def _decode_call(q_dec, k_pages, v_pages, kv_lens, block_tables, scales, *,
                 sm_scale, sliding_window, logit_soft_cap, pages_per_block,
                 num_splits, prefetch, num_warps, num_stages, interpret):
    num_seqs, num_kv_heads, rows, head_dim = q_dec.shape
    _, num_pages, page_size, _ = k_pages.shape
    pages_padded = block_tables.shape[1]
    kernel = functools.partial(
        _decode_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, pages_per_block=pages_per_block,
        num_splits=num_splits, prefetch=prefetch)
    part = (num_seqs, num_kv_heads, num_splits)
    pages_spec = pl.BlockSpec((None, num_pages, page_size, head_dim),
                              lambda s, k, j: (k, 0, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(num_seqs, num_kv_heads, num_splits),
        in_specs=[
            pl.BlockSpec((num_seqs,), lambda s, k, j: (0,)),
            pl.BlockSpec((None, pages_padded), lambda s, k, j: (s, 0)),
            pl.BlockSpec((2,), lambda s, k, j: (0,)),
            pl.BlockSpec((None, None, rows, head_dim),
                         lambda s, k, j: (s, k, 0, 0)),
            pages_spec, pages_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, rows, head_dim),
                         lambda s, k, j: (s, k, j, 0, 0)),
            pl.BlockSpec((None, None, None, rows), lambda s, k, j: (s, k, j, 0)),
            pl.BlockSpec((None, None, None, rows), lambda s, k, j: (s, k, j, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((*part, rows, head_dim), jnp.float32),
            jax.ShapeDtypeStruct((*part, rows), jnp.float32),
            jax.ShapeDtypeStruct((*part, rows), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps,
                                             num_stages=num_stages),
        interpret=interpret,
        name="ragged_paged_attention_decode",
    )(kv_lens, block_tables, scales, q_dec, k_pages, v_pages)


def _combine_splits(o, m, l):
    """Merges the split partial softmaxes: [S, K, J, Gp, H] -> [S, K, Gp, H]."""
    m_max = m.max(axis=2, keepdims=True)
    w = jnp.exp2(m - m_max)  # [S, K, J, Gp]
    denom = (w * l).sum(axis=2)
    num = (w[..., None] * o).sum(axis=2)
    return num / jnp.where(denom > 0, denom, 1.0)[..., None]


# ---------------------------------------------------------------- prefill ---

def _prefill_kernel(
    item_seq_ref,  # [I] int32 sequence of each work item
    item_start_ref,  # [I] int32 first query row of the item; -1 = no work
    cu_q_lens_ref,  # [S + 1] int32
    kv_lens_ref,  # [S] int32
    block_tables_ref,  # [S, P_pad] int32
    scales_ref,  # [2] f32 (k_scale, v_scale)
    q_ref,  # [T, H] this query head
    k_pages_ref,  # [num_pages, B, H] this head's kv head
    v_pages_ref,  # [num_pages, B, H]
    o_init_ref,  # [T, H] aliased with o_ref (decode rows, zeros elsewhere)
    o_ref,  # [T, H]
    *, sm_scale, sliding_window, logit_soft_cap, block_q, pages_per_block):
    del o_init_ref
    item = pl.program_id(1)
    start = item_start_ref[item]
    num_rows, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[1]
    bk = pages_per_block * page_size

    @pl.when(start >= 0)
    def _():
        seq = item_seq_ref[item]
        q_begin = cu_q_lens_ref[seq]
        q_end = cu_q_lens_ref[seq + 1]
        kv_len = kv_lens_ref[seq]
        offset = kv_len - (q_end - q_begin) - q_begin  # position = row + offset
        # Keep the tile inside [0, T): shift it back and mask the extra rows.
        load = jnp.minimum(start, num_rows - block_q)
        rows = load + jnp.arange(block_q, dtype=jnp.int32)
        row_ok = (rows >= start) & (rows < q_end)
        pos = rows + offset
        q = q_ref[pl.ds(load, block_q), :]

        last_pos = jnp.minimum(start + block_q, q_end) - 1 + offset
        hi = pl.cdiv(last_pos + 1, bk)
        lo = 0
        if sliding_window is not None:
            lo = jnp.maximum(start + offset - sliding_window + 1, 0) // bk

        def body(b, carry, masked):
            pages = block_tables_ref[seq, pl.ds(b * pages_per_block,
                                                pages_per_block)]
            k = k_pages_ref[pages].reshape(bk, head_dim)
            v = v_pages_ref[pages].reshape(bk, head_dim).astype(q.dtype)
            s = _logits(q, k, sm_scale, scales_ref[0], logit_soft_cap)
            if masked:
                kv_pos = b * bk + jnp.arange(bk, dtype=jnp.int32)
                mask = kv_pos[None, :] <= pos[:, None]
                if sliding_window is not None:
                    mask &= kv_pos[None, :] > pos[:, None] - sliding_window
                s = jnp.where(mask, s, _MASK_VALUE)
            return _online_softmax_step(carry, s, v)

        carry = (jnp.zeros((block_q, head_dim), jnp.float32),
                 jnp.full((block_q,), _MASK_VALUE, jnp.float32),
                 jnp.zeros((block_q,), jnp.float32))
        # Blocks wholly at or before the tile's first position need no causal
        # mask; the diagonal blocks (and, with a window, all) do.
        full = lo if sliding_window is not None else (start + offset + 1) // bk
        mid = jnp.clip(full, lo, hi)
        carry = jax.lax.fori_loop(lo, mid, functools.partial(body, masked=False),
                                  carry)
        o, _, l = jax.lax.fori_loop(mid, hi, functools.partial(body, masked=True),
                                    carry)
        o = o * (scales_ref[1] / jnp.where(l > 0, l, 1.0))[:, None]
        plgpu.store(o_ref.at[pl.ds(load, block_q), :], o.astype(o_ref.dtype),
                    mask=row_ok[:, None])


def _prefill_call(q, k_pages, v_pages, o_init, item_seq, item_start,
                  cu_q_lens, kv_lens, block_tables, scales, *, sm_scale,
                  sliding_window, logit_soft_cap, block_q, pages_per_block,
                  num_warps, num_stages, interpret):
    num_rows, num_q_heads, head_dim = q.shape
    num_kv_heads, num_pages, page_size, _ = k_pages.shape
    group = num_q_heads // num_kv_heads
    kernel = functools.partial(
        _prefill_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, block_q=block_q,
        pages_per_block=pages_per_block)
    full = lambda x: pl.BlockSpec(x.shape, lambda n, i: (0,) * x.ndim)
    rows_spec = pl.BlockSpec((num_rows, None, head_dim), lambda n, i: (0, n, 0))
    pages_spec = pl.BlockSpec((None, num_pages, page_size, head_dim),
                              lambda n, i: (n // group, 0, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(num_q_heads, item_seq.shape[0]),
        in_specs=[full(item_seq), full(item_start), full(cu_q_lens),
                  full(kv_lens), full(block_tables), full(scales),
                  rows_spec, pages_spec, pages_spec, rows_spec],
        out_specs=rows_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        input_output_aliases={9: 0},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps,
                                             num_stages=num_stages),
        interpret=interpret,
        name="ragged_paged_attention_prefill",
    )(item_seq, item_start, cu_q_lens, kv_lens, block_tables, scales, q,
      k_pages, v_pages, o_init)


def _prefill_work_items(cu_q_lens, num_seqs, num_items, block_q):
    """Splits every prefill sequence (q_len > 1) into block_q-row items:
    (item_seq [I], item_start [I], -1 where the item is unused)."""
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    real = jnp.arange(q_lens.shape[0]) < num_seqs
    nblk = jnp.where(real & (q_lens > 1), pl.cdiv(q_lens, block_q), 0)
    ends = jnp.cumsum(nblk)
    i = jnp.arange(num_items, dtype=jnp.int32)
    # compare_all: one fused [I, S] comparison (the default binary search is
    # a loop, which XLA on GPU runs as a while loop with a host round trip
    # per iteration).
    seq = jnp.searchsorted(ends, i, side="right",
                           method="compare_all").astype(jnp.int32)
    seq = jnp.minimum(seq, q_lens.shape[0] - 1)
    # Heaviest (last) query block of each sequence first: shorter tail.
    blk = ends[seq] - 1 - i
    start = jnp.where(i < ends[-1], cu_q_lens[seq] + blk * block_q, -1)
    return seq, start.astype(jnp.int32)


# ----------------------------------------------------------------- public ---

@functools.cache
def _hopper() -> bool:
    """Whether the default device is a Hopper GPU (compute capability 9.x:
    TMA and wgmma) with Mosaic GPU importable."""
    try:
        dev = jax.devices()[0]
        importlib.import_module("jax.experimental.pallas.mosaic_gpu")
    except Exception:  # pragma: no cover - no device / no Mosaic GPU
        return False
    cc = getattr(dev, "compute_capability", None)
    return (dev.platform == "gpu" and cc is not None
            and 9.0 <= float(cc) < 10.0)


def _use_mosaic_decode(tuning, interpret, q_dtype, kv_dtype, head_dim,
                       page_size, group) -> bool:
    """The decode backend, chosen once per trace from the platform: the
    Mosaic GPU kernel on Hopper for the cases it takes, else Triton."""
    if tuning.decode_backend == "triton":
        return False
    why = _mgpu.supports(q_dtype, kv_dtype, head_dim, page_size, group,
                         tuning.mosaic_decode.tokens_per_step)
    if tuning.decode_backend == "mosaic":
        if why:
            raise RaggedAttentionShapeError(
                f"decode_backend='mosaic' does not take this case: {why}")
        return True
    return why is None and not interpret and _hopper()


def _use_mosaic_prefill(tuning, interpret, q_dtype, kv_dtype, head_dim,
                        page_size, pages_per_seq) -> bool:
    """The prefill backend, chosen once per trace from the platform: the
    Mosaic GPU kernel on Hopper for the cases it takes, else Triton."""
    if tuning.prefill_backend == "triton" or interpret:
        return False
    why = _pf.supports(q_dtype, kv_dtype, head_dim, page_size,
                       tuning.mosaic_prefill, pages_per_seq)
    if tuning.prefill_backend == "mosaic":
        if why:
            raise RaggedAttentionShapeError(
                f"prefill_backend='mosaic' does not take this case: {why}")
        return True
    return why is None and _hopper()


@functools.partial(
    jax.jit,
    static_argnames=("sm_scale", "sliding_window", "logit_soft_cap",
                     "tuning", "interpret"))
def ragged_paged_attention(
    q: jax.Array,  # [T, N, H]
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    kv_lens: jax.Array,  # [S] int32 tokens in each sequence's pages
    block_tables: jax.Array,  # [S, P] int32 page ids
    cu_q_lens: jax.Array,  # [S + 1] int32 cumulative query lengths
    num_seqs: jax.Array,  # [] or [1] int32 real sequences
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    k_scale: jax.Array | float | None = None,
    v_scale: jax.Array | float | None = None,
    tuning: RaggedPagedAttentionTuning | None = None,
    interpret: bool = False,
) -> jax.Array:  # [T, N, H]
    """Attention of a ragged batch over the paged KV pool (see module doc)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, page_size, head_dim_k = k_pages.shape
    num_seq_rows, pages_per_seq = block_tables.shape
    if k_pages.shape != v_pages.shape:
        raise RaggedAttentionShapeError(
            f"k_pages {k_pages.shape} and v_pages {v_pages.shape} differ")
    if num_q_heads % num_kv_heads:
        raise RaggedAttentionShapeError(
            f"query heads ({num_q_heads}) must be a multiple of kv heads "
            f"({num_kv_heads})")
    if head_dim_k != head_dim or head_dim & (head_dim - 1):
        raise RaggedAttentionShapeError(
            f"head_dim of q ({head_dim}) and pages ({head_dim_k}) must be "
            "equal and a power of two")
    if page_size & (page_size - 1):
        raise RaggedAttentionShapeError(f"page size {page_size} must be a "
                                        "power of two")
    if kv_lens.shape != (num_seq_rows,) or cu_q_lens.shape != (num_seq_rows + 1,):
        raise RaggedAttentionShapeError(
            f"kv_lens {kv_lens.shape} must be [S] and cu_q_lens "
            f"{cu_q_lens.shape} [S + 1] for block_tables {block_tables.shape}")
    if tuning is None:
        tuning = default_tuning(head_dim, page_size)
    tuning = tuning.for_itemsize(jnp.dtype(q.dtype).itemsize)
    group = num_q_heads // num_kv_heads
    num_seqs = jnp.reshape(num_seqs, ())
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    scales = jnp.stack([
        jnp.asarray(1.0 if k_scale is None else k_scale, jnp.float32).reshape(()),
        jnp.asarray(1.0 if v_scale is None else v_scale, jnp.float32).reshape(()),
    ])

    # Pad the block table so every tile's page slice stays in bounds.
    ppb = max(tuning.decode_pages_per_block, tuning.prefill_pages_per_block)
    pages_padded = pl.cdiv(pages_per_seq, ppb) * ppb
    tables = jnp.pad(block_tables.astype(jnp.int32),
                     ((0, 0), (0, pages_padded - pages_per_seq)))

    # Decode: one row per sequence; everything else gets kv_len 0 (no work).
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    is_dec = (q_lens == 1) & (jnp.arange(num_seq_rows) < num_seqs)
    dec_rows = jnp.minimum(cu_q_lens[:-1], num_tokens - 1)
    q_dec = q[dec_rows].reshape(num_seq_rows, num_kv_heads, group, head_dim)
    if _use_mosaic_decode(tuning, interpret, q.dtype, k_pages.dtype,
                          head_dim, page_size, group):
        if k_scale is not None:  # folded into the rows, as (q k) * k_scale
            q_dec = (q_dec.astype(jnp.float32) * scales[0]).astype(q.dtype)
        o_dec = _mgpu.decode_attention(
            q_dec, k_pages, v_pages, jnp.where(is_dec, kv_lens, 0),
            block_tables, sm_scale=sm_scale, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, tuning=tuning.mosaic_decode,
            interpret=interpret) * scales[1]
    else:
        rows = max(16, 1 << (group - 1).bit_length())
        q_dec = jnp.pad(q_dec, ((0, 0), (0, 0), (0, rows - group), (0, 0)))
        splits = tuning.kv_splits(num_seq_rows, num_kv_heads,
                                  pages_padded // tuning.decode_pages_per_block)
        o_dec, m_dec, l_dec = _decode_call(
            q_dec, k_pages, v_pages, jnp.where(is_dec, kv_lens, 0), tables,
            scales, sm_scale=sm_scale, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap,
            pages_per_block=tuning.decode_pages_per_block, num_splits=splits,
            prefetch=tuning.decode_prefetch,
            num_warps=tuning.decode_num_warps,
            num_stages=tuning.decode_num_stages, interpret=interpret)
        o_dec = _combine_splits(o_dec, m_dec, l_dec)[:, :, :group] * scales[1]
    o_dec = o_dec.reshape(num_seq_rows, num_q_heads, head_dim).astype(q.dtype)
    if _use_mosaic_prefill(tuning, interpret, q.dtype, k_pages.dtype,
                           head_dim, page_size, pages_per_seq):
        # Prefill rows from the kernel; decode rows and padding placed by its
        # wrapper (one small scatter, no pass over all rows).
        return _pf.prefill_attention(
            q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens, num_seqs,
            o_dec, sm_scale=sm_scale, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, k_scale=scales[0],
            v_scale=scales[1], tuning=tuning.mosaic_prefill)

    # Prefill: rows of sequences with q_len > 1, written over the decode rows.
    block_q = tuning.prefill_block_q
    q_rows = max(num_tokens, block_q)
    q_pad = jnp.pad(q, ((0, q_rows - num_tokens), (0, 0), (0, 0)))
    # Decode rows gathered into place (one fusion; a scatter into zeros is
    # two kernels): token t is sequence seq_of[t]'s decode row or zeros.
    t = jnp.arange(q_rows, dtype=jnp.int32)
    seq_of = jnp.minimum(jnp.searchsorted(
        cu_q_lens[1:], t, side="right", method="compare_all"),
        num_seq_rows - 1).astype(jnp.int32)
    tok_dec = is_dec[seq_of] & (t == cu_q_lens[seq_of])
    out = jnp.where(tok_dec[:, None, None], o_dec[seq_of], 0).astype(q.dtype)
    num_items = pl.cdiv(num_tokens, block_q) + num_seq_rows
    item_seq, item_start = _prefill_work_items(cu_q_lens, num_seqs, num_items,
                                               block_q)
    out = _prefill_call(
        q_pad, k_pages, v_pages, out, item_seq, item_start, cu_q_lens,
        kv_lens, tables, scales, sm_scale=sm_scale,
        sliding_window=sliding_window, logit_soft_cap=logit_soft_cap,
        block_q=block_q, pages_per_block=tuning.prefill_pages_per_block,
        num_warps=tuning.prefill_num_warps,
        num_stages=tuning.prefill_num_stages, interpret=interpret)
    return out[:num_tokens]


__all__ = ["RaggedAttentionShapeError", "RaggedPagedAttentionTuning",
           "ragged_paged_attention", "ragged_paged_attention_reference"]
