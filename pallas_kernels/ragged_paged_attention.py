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

  - Mosaic GPU (``ragged_paged_attention_decode_mgpu.py``), the default on
    Hopper (compute capability 9.x) for bf16/f16 queries over pages of the
    same dtype or of fp8 e4m3 (with per-tensor or per-page scales), pages
    of 16 tokens, head dims 64/128/256, GQA groups up to 64: one program
    per (sequence, kv head, split) reads each K/V page once for the whole
    GQA group through per-page TMA copies into a multi-stage smem ring (a
    producer warpgroup issues the copies, a consumer warpgroup runs wgmma +
    online softmax), split-KV with a jnp combine for small batches. It
    keeps more bytes in flight than the Triton kernel's in-loop page gather
    can, which is what a memory-bound decode needs. fp8 pages are copied as
    fp8 and dequantized in shared memory (times their per-page scales) into
    16-bit tiles for wgmma, by the producer warpgroup. A per-tensor
    ``k_scale`` is folded into its query rows.
  - Triton (``ragged_paged_attention_triton.py``), everywhere else: f32
    (wgmma takes 16-bit operands), page dtypes other than q's and fp8 e4m3,
    per-page scales on 16-bit pages, page size 32 (the Mosaic kernel
    faults there at its full ring depth on long sequences), other GPUs,
    and interpret mode on CPU. Grid (S, K, splits); one program reads each K/V
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
``ragged_paged_attention_prefill_mgpu.py`` (FA3 form, one TMA copy per page).
Elsewhere (f32, H=256, other GPUs, interpret mode on CPU)
Pallas' Triton lowering (``pl.pallas_call`` + ``plgpu.CompilerParams``),
which runs unchanged on jax 0.10 and 0.11 and gathers pages with pointer
gathers. ``tuning.prefill_backend`` forces either.

K/V scale hooks (fp8 pages): ``k_scale``/``v_scale`` are each None, one
scale per tensor (a scalar), or one per (kv head, page), ``[K, num_pages]``
f32 (``kv_cache.py``). The pages are upcast to the query dtype inside the
kernel; a per-tensor ``k_scale`` multiplies the logits and ``v_scale`` the
outputs. Per-page scales are read through the block table beside the pages:
the Triton kernels multiply each tile's logits by its pages' K scales, and
its probabilities by their V scales before the PV product, so the softmax
denominator is unchanged; the Mosaic decode kernel multiplies each fp8
page by its scales as it dequantizes it (its wrapper gathers the scales of
each sequence's table). The Mosaic prefill kernel takes per-tensor scales
on 16-bit pages only: prefill over fp8 pages runs on Triton.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from . import kv_cache
from . import ragged_paged_attention_decode_mgpu as _decode_mgpu
from . import ragged_paged_attention_prefill_mgpu as _prefill_mgpu
from .kernel_common import hopper as _hopper
from .kernel_common import per_tensor_scales
from .ragged_paged_attention_reference import ragged_paged_attention_reference
from .ragged_paged_attention_triton import (
    combine_splits,
    decode_call,
    prefill_call,
    prefill_work_items,
)
from .ragged_paged_attention_tuning import RaggedPagedAttentionTuning, default_tuning


class RaggedAttentionShapeError(ValueError):
    """Inputs whose shapes the kernels cannot take; says what to change."""


# ----------------------------------------------------------------- public ---

_PER_PAGE = "per-page K/V scales (the Triton kernels read them)"


def _use_mosaic_decode(tuning: RaggedPagedAttentionTuning, interpret: bool,
                       q_dtype: jax.typing.DTypeLike,
                       kv_dtype: jax.typing.DTypeLike, head_dim: int,
                       page_size: int, group: int,
                       per_page_scales: bool) -> bool:
    """The decode backend, chosen once per trace from the platform: the
    Mosaic GPU kernel on Hopper for the cases it takes, else Triton."""
    if tuning.decode_backend == "triton":
        return False
    why = _decode_mgpu.supports(
        q_dtype, kv_dtype, head_dim, page_size, group,
        tuning.mosaic_decode.tokens_per_step, per_page_scales)
    if tuning.decode_backend == "mosaic":
        if why:
            raise RaggedAttentionShapeError(
                f"decode_backend='mosaic' does not take this case: {why}")
        return True
    return why is None and not interpret and _hopper()


def _use_mosaic_prefill(tuning: RaggedPagedAttentionTuning, interpret: bool,
                        q_dtype: jax.typing.DTypeLike,
                        kv_dtype: jax.typing.DTypeLike, head_dim: int,
                        page_size: int, pages_per_seq: int,
                        per_page_scales: bool) -> bool:
    """The prefill backend, chosen once per trace from the platform: the
    Mosaic GPU kernel on Hopper for the cases it takes, else Triton."""
    if tuning.prefill_backend == "triton" or interpret:
        return False
    why = _PER_PAGE if per_page_scales else _prefill_mgpu.supports(
        q_dtype, kv_dtype, head_dim, page_size, tuning.mosaic_prefill,
        pages_per_seq)
    if tuning.prefill_backend == "mosaic":
        if why:
            raise RaggedAttentionShapeError(
                f"prefill_backend='mosaic' does not take this case: {why}")
        return True
    return why is None and _hopper()


def _split_scales(k_scale, v_scale, num_kv_heads, num_pages):
    """(per-tensor [2] f32 (k, v), per-page [K, 2, num_pages] f32 or None).
    Each scale is None, a scalar, or [K, num_pages] (kv_cache.py); with one
    of them per page, a scalar other is spread over the pages."""
    per_page_shape = kv_cache.page_scales_shape(num_pages, num_kv_heads)
    given = {"k_scale": k_scale, "v_scale": v_scale}
    for name, x in given.items():
        if x is not None and jnp.size(x) != 1 and jnp.shape(x) != per_page_shape:
            raise RaggedAttentionShapeError(
                f"{name} has shape {jnp.shape(x)}: give one scale per tensor "
                f"(a scalar) or per (kv head, page) {per_page_shape}")
    if all(x is None or jnp.size(x) == 1 for x in given.values()):
        return per_tensor_scales(k_scale, v_scale), None
    per_page = [jnp.broadcast_to(
        per_tensor_scales(x)[0] if x is None or jnp.size(x) == 1
        else jnp.asarray(x, jnp.float32), per_page_shape)
        for x in (k_scale, v_scale)]
    return jnp.ones((2,), jnp.float32), jnp.stack(per_page, axis=1)


def _check_shapes(q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens):
    """Trace-time shape checks; each error says what to change."""
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads, _, page_size, head_dim_k = k_pages.shape
    num_seq_rows = block_tables.shape[0]
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


def _decode_queries(q, cu_q_lens, num_seq_rows, decode_only):
    """[S, N, H]: each sequence's decode row (garbage for the others, whose
    kv length the caller zeroes)."""
    num_tokens = q.shape[0]
    if decode_only:  # row s is sequence s's token
        return q[:num_seq_rows] if num_tokens >= num_seq_rows else jnp.pad(
            q, ((0, num_seq_rows - num_tokens), (0, 0), (0, 0)))
    return q[jnp.minimum(cu_q_lens[:-1], num_tokens - 1)]


def _decode(q_dec, k_pages, v_pages, dec_kv_lens, block_tables, tables,
            scales, page_scales, k_scale, *, sm_scale, sliding_window,
            logit_soft_cap, tuning, interpret, use_mosaic):
    """The decode kernel over [S, K, G, H] query rows -> [S, K, G, H] f32
    (zeros where ``dec_kv_lens`` is 0), v_scale applied."""
    if use_mosaic:
        if k_scale is not None and page_scales is None:
            # folded into the rows, as (q k) * k_scale
            q_dec = (q_dec.astype(jnp.float32) * scales[0]).astype(q_dec.dtype)
        return _decode_mgpu.decode_attention(
            q_dec, k_pages, v_pages, dec_kv_lens, block_tables, page_scales,
            sm_scale=sm_scale, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, tuning=tuning.mosaic_decode,
            interpret=interpret) * scales[1]
    return _triton_decode(q_dec, k_pages, v_pages, dec_kv_lens, tables,
                          scales, page_scales, sm_scale=sm_scale,
                          sliding_window=sliding_window,
                          logit_soft_cap=logit_soft_cap, tuning=tuning,
                          interpret=interpret)


def _triton_decode(q_rows, k_pages, v_pages, kv_lens, tables, scales,
                   page_scales, *, sm_scale, sliding_window, logit_soft_cap,
                   tuning, interpret, q_lens=None, width=1):
    """The Triton decode kernel over [S, K, R, H] query rows (padded to a
    power of two, at least 16, for the tensor cores), split over the KV
    axis and merged -> [S, K, R, H] f32, v_scale applied. ``width`` > 1:
    R = width * G rows, token-major, masked causally by ``q_lens``."""
    num_seq_rows, num_kv_heads, rows, _ = q_rows.shape
    padded = max(16, 1 << (rows - 1).bit_length())
    q_rows = jnp.pad(q_rows, ((0, 0), (0, 0), (0, padded - rows), (0, 0)))
    splits = tuning.kv_splits(num_seq_rows, num_kv_heads,
                              tables.shape[1] // tuning.decode_pages_per_block)
    o, m, l = decode_call(
        q_rows, k_pages, v_pages, kv_lens, tables, scales, page_scales,
        sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap,
        pages_per_block=tuning.decode_pages_per_block, num_splits=splits,
        prefetch=tuning.decode_prefetch, num_warps=tuning.decode_num_warps,
        num_stages=tuning.decode_num_stages, interpret=interpret,
        q_lens=q_lens, query_tokens=width, group=rows // width)
    return combine_splits(o, m, l)[:, :, :rows] * scales[1]


def _short_queries(q, k_pages, v_pages, kv_lens, q_lens, block_tables, tables,
                   cu_q_lens, num_seqs, scales, page_scales, width, *,
                   sm_scale,
                   sliding_window, logit_soft_cap, tuning, interpret):
    """[T, N, H] of a step whose sequences bring at most ``width`` query
    tokens each, through the Triton decode kernel: sequence s's tokens
    gathered into [K, width * G] rows (token-major), each masked causally
    (token j of q_len sees kv_len - q_len + 1 + j positions)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pages.shape[0]
    num_seq_rows = block_tables.shape[0]
    group = num_q_heads // num_kv_heads
    live = jnp.arange(num_seq_rows) < num_seqs
    j = jnp.arange(width, dtype=jnp.int32)
    # Token j of sequence s (a sequence's tokens past its q_len repeat its
    # last one: their rows are computed and dropped).
    idx = cu_q_lens[:-1, None] + jnp.minimum(
        j[None, :], jnp.maximum(q_lens - 1, 0)[:, None])
    idx = jnp.minimum(idx, num_tokens - 1)
    q_rows = q[idx].reshape(num_seq_rows, width, num_kv_heads, group, head_dim)
    q_rows = q_rows.transpose(0, 2, 1, 3, 4).reshape(
        num_seq_rows, num_kv_heads, width * group, head_dim)
    seq_kv_lens = jnp.where(live & (q_lens > 0), kv_lens, 0)
    o = _triton_decode(q_rows, k_pages, v_pages, seq_kv_lens, tables, scales,
                       page_scales, sm_scale=sm_scale,
                       sliding_window=sliding_window,
                       logit_soft_cap=logit_soft_cap, tuning=tuning,
                       interpret=interpret, q_lens=q_lens, width=width)
    o = o.reshape(num_seq_rows, num_kv_heads, width, group, head_dim)
    o = o.transpose(0, 2, 1, 3, 4).reshape(num_seq_rows * width, num_q_heads,
                                           head_dim).astype(q.dtype)
    keep = (j[None, :] < q_lens[:, None]) & live[:, None]
    target = jnp.where(keep, idx, num_tokens).reshape(-1)
    return jnp.zeros_like(q).at[target].set(o, mode="drop")


def _decode_only_output(o_dec, is_dec, num_tokens):
    """[T, N, H] of a decode-only step: row s is sequence s's output."""
    num_seq_rows = o_dec.shape[0]
    out = jnp.where(is_dec[:, None, None], o_dec, 0)
    if num_tokens <= num_seq_rows:
        return out[:num_tokens]
    return jnp.pad(out, ((0, num_tokens - num_seq_rows), (0, 0), (0, 0)))


def _triton_prefill(q, k_pages, v_pages, kv_lens, tables, cu_q_lens, num_seqs,
                    o_dec, is_dec, scales, page_scales, *, sm_scale,
                    sliding_window, logit_soft_cap, tuning, interpret):
    """[T, N, H]: the Triton prefill kernel's rows for sequences with
    q_len > 1, written over the decode rows ``o_dec`` placed by row."""
    num_tokens = q.shape[0]
    num_seq_rows = o_dec.shape[0]
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
    item_seq, item_start = prefill_work_items(cu_q_lens, num_seqs, num_items,
                                               block_q)
    out = prefill_call(
        q_pad, k_pages, v_pages, out, item_seq, item_start, cu_q_lens,
        kv_lens, tables, scales, page_scales, sm_scale=sm_scale,
        sliding_window=sliding_window, logit_soft_cap=logit_soft_cap,
        block_q=block_q, pages_per_block=tuning.prefill_pages_per_block,
        num_warps=tuning.prefill_num_warps,
        num_stages=tuning.prefill_num_stages, interpret=interpret)
    return out[:num_tokens]


@functools.partial(
    jax.jit,
    static_argnames=("sm_scale", "sliding_window", "logit_soft_cap",
                     "tuning", "interpret", "decode_only", "max_q_len"))
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
    decode_only: bool = False,
    max_q_len: int = 0,
) -> jax.Array:  # [T, N, H]
    """Attention of a ragged batch over the paged KV pool (see module doc).

    ``decode_only`` (static): the caller's promise that every real sequence
    has ``q_len == 1``, so sequence ``s`` owns row ``s`` (``cu_q_lens[s] ==
    s``). Only the decode kernel runs then: no prefill work items, no
    prefill launch, no row gather or scatter around it. Rows
    of a sequence with ``q_len > 1`` would come back wrong, so the engine
    sets it only for steps it scheduled as decodes alone.

    ``max_q_len`` (static, > 1): the caller's promise that every real
    sequence has at most this many query tokens (a speculative verifying
    step: k + 1 per sequence). The decode kernel then serves all of them
    (`_short_queries`): each sequence's K/V is read once per GQA group, not
    once per query head and 64-row tile as the prefill kernel would."""
    _check_shapes(q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    num_seq_rows, pages_per_seq = block_tables.shape
    if tuning is None:
        tuning = default_tuning(head_dim, page_size,
                                kv_itemsize=jnp.dtype(k_pages.dtype).itemsize)
    tuning = tuning.for_itemsize(jnp.dtype(q.dtype).itemsize)
    group = num_q_heads // num_kv_heads
    num_seqs = jnp.reshape(num_seqs, ())
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    scales, page_scales = _split_scales(k_scale, v_scale, num_kv_heads,
                                        k_pages.shape[1])
    per_page = page_scales is not None
    kernel_kw = dict(sm_scale=sm_scale, sliding_window=sliding_window,
                     logit_soft_cap=logit_soft_cap, tuning=tuning,
                     interpret=interpret)

    # Pad the block table so every tile's page slice stays in bounds.
    ppb = max(tuning.decode_pages_per_block, tuning.prefill_pages_per_block)
    pages_padded = pl.cdiv(pages_per_seq, ppb) * ppb
    tables = jnp.pad(block_tables.astype(jnp.int32),
                     ((0, 0), (0, pages_padded - pages_per_seq)))

    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    if max_q_len > 1:
        return _short_queries(q, k_pages, v_pages, kv_lens, q_lens,
                              block_tables, tables, cu_q_lens, num_seqs,
                              scales, page_scales, max_q_len, **kernel_kw)
    # Decode: one row per sequence; everything else gets kv_len 0 (no work).
    is_dec = (q_lens == 1) & (jnp.arange(num_seq_rows) < num_seqs)
    dec_kv_lens = jnp.where(is_dec, kv_lens, 0)
    q_dec = _decode_queries(q, cu_q_lens, num_seq_rows, decode_only).reshape(
        num_seq_rows, num_kv_heads, group, head_dim)
    o_dec = _decode(
        q_dec, k_pages, v_pages, dec_kv_lens, block_tables, tables, scales,
        page_scales, k_scale, use_mosaic=_use_mosaic_decode(
            tuning, interpret, q.dtype, k_pages.dtype, head_dim, page_size,
            group, per_page), **kernel_kw)
    o_dec = o_dec.reshape(num_seq_rows, num_q_heads, head_dim).astype(q.dtype)
    if decode_only:
        return _decode_only_output(o_dec, is_dec, num_tokens)

    if _use_mosaic_prefill(tuning, interpret, q.dtype, k_pages.dtype,
                           head_dim, page_size, pages_per_seq, per_page):
        # Prefill rows from the kernel; decode rows and padding placed by its
        # wrapper (one small scatter, no pass over all rows).
        return _prefill_mgpu.prefill_attention(
            q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens, num_seqs,
            o_dec, sm_scale=sm_scale, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, k_scale=scales[0],
            v_scale=scales[1], tuning=tuning.mosaic_prefill)
    return _triton_prefill(q, k_pages, v_pages, kv_lens, tables, cu_q_lens,
                           num_seqs, o_dec, is_dec, scales, page_scales,
                           **kernel_kw)


__all__ = ["RaggedAttentionShapeError", "RaggedPagedAttentionTuning",
           "ragged_paged_attention", "ragged_paged_attention_reference"]
