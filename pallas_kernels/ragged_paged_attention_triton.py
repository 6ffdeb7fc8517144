"""The Triton-lowered halves of ``ragged_paged_attention`` (Pallas'
``pl.pallas_call`` + ``plgpu.CompilerParams``): the decode kernel (grid
(S, K, splits), one K/V tile read per GQA group, a flash-decoding combine)
and the prefill kernel (grid (N, work items) walking each sequence's pages).
They run wherever the Mosaic GPU kernels do not (f32, page 32 decode, H=256
prefill, other GPUs) and in interpret mode on CPU; ragged_paged_attention.py
chooses.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .kernel_common import LOG2E, MASK_VALUE, sequence_work_items


def _logits(q, k, sm_scale, k_scale, logit_soft_cap, col_scale=None):
    """[R, H] x [BK, H] -> [R, BK] f32 logits, base-2 scaled; ``col_scale``
    [BK]: per-token K scales (per-page scales spread over their tokens)."""
    s = jax.lax.dot_general(q, k.astype(q.dtype), (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
    s = s * (sm_scale * k_scale)
    if col_scale is not None:
        s = s * col_scale[None, :]
    if logit_soft_cap is not None:
        s = logit_soft_cap * jnp.tanh(s / logit_soft_cap)
    return s * LOG2E


def _online_softmax_step(carry, s, v, v_scale=None):
    """One flash step: s [R, BK] (masked, base 2), v [BK, H]; ``v_scale``
    [BK]: per-token V scales, applied to the probabilities (sum_j p_j s_j
    v_j) so the denominator stays the plain sum."""
    o, m, l = carry
    m_next = jnp.maximum(m, s.max(axis=1))
    corr = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    l_next = corr * l + p.sum(axis=1)
    pv = p if v_scale is None else p * v_scale[None, :]
    o_next = corr[:, None] * o + jax.lax.dot_general(
        pv.astype(v.dtype), v, (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32)
    return o_next, m_next, l_next


def _token_scales(page_scales_ref, pages, page_size):
    """Per-page (k, v) scales of a tile's pages [ppb], spread over its
    ppb * B tokens: two [ppb * B] f32 vectors."""
    def spread(x):
        return jnp.broadcast_to(x[:, None], (x.shape[0], page_size)).reshape(-1)
    return spread(page_scales_ref[0, pages]), spread(page_scales_ref[1, pages])


# ----------------------------------------------------------------- decode ---

def decode_kernel(
    kv_lens_ref,  # [S] int32; 0 for sequences that are not decodes
    q_lens_ref,  # [S] int32 query tokens per sequence (read when query_tokens > 1)
    block_tables_ref,  # [P_pad] int32 this sequence's pages
    scales_ref,  # [2] f32 (k_scale, v_scale)
    page_scales_ref,  # [2, num_pages] f32 this kv head's per-page (k, v) scales
    q_ref,  # [Gp, H] this group's query heads (zero padded)
    k_pages_ref,  # [num_pages, B, H] this kv head
    v_pages_ref,  # [num_pages, B, H]
    o_ref,  # [Gp, H] f32 unnormalized partial output of this split
    m_ref,  # [Gp] f32 running max (base 2)
    l_ref,  # [Gp] f32 running sum
    *, sm_scale, sliding_window, logit_soft_cap, pages_per_block, num_splits,
    prefetch, per_page_scales, query_tokens, group):
    """``query_tokens`` (static) > 1: a sequence brings up to that many
    query tokens (a verifying step), row r being query token r // group's
    head r % group; token j of q_len sees the first kv_len - q_len + 1 + j
    positions (causal). 1: one token per sequence, every row sees kv_len."""
    seq, split = pl.program_id(0), pl.program_id(2)
    rows, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[1]
    bk = pages_per_block * page_size
    kv_len = kv_lens_ref[seq]
    k_scale = scales_ref[0]
    # Per row: how many positions it sees (row_lim) and the fewest any
    # row sees (first_lim): blocks below first_lim need no mask.
    row_lim, first_lim = None, kv_len
    if query_tokens > 1:
        first_lim = kv_len - jnp.maximum(q_lens_ref[seq], 1) + 1
        token = jnp.arange(rows, dtype=jnp.int32) // group
        row_lim = jnp.minimum(first_lim + token, kv_len)

    num_blocks = pl.cdiv(kv_len, bk)
    lo = 0
    if sliding_window is not None:
        lo = jnp.maximum(first_lim - sliding_window, 0) // bk
    per_split = pl.cdiv(num_blocks - lo, num_splits)
    start = lo + split * per_split
    end = jnp.minimum(start + per_split, num_blocks)
    q = q_ref[...]

    def load(b):
        pages = block_tables_ref[pl.ds(b * pages_per_block, pages_per_block)]
        return (k_pages_ref[pages].reshape(bk, head_dim),
                v_pages_ref[pages].reshape(bk, head_dim))

    def attend(b, carry, k, v, masked):
        ks = vs = None
        if per_page_scales:
            pages = block_tables_ref[pl.ds(b * pages_per_block, pages_per_block)]
            ks, vs = _token_scales(page_scales_ref, pages, page_size)
        s = _logits(q, k, sm_scale, k_scale, logit_soft_cap, ks)
        if masked:
            kv_pos = b * bk + jnp.arange(bk, dtype=jnp.int32)
            if row_lim is None:
                mask = kv_pos < kv_len
                if sliding_window is not None:
                    mask &= kv_pos >= kv_len - sliding_window
                mask = mask[None, :]
            else:
                mask = kv_pos[None, :] < row_lim[:, None]
                if sliding_window is not None:
                    mask &= kv_pos[None, :] >= row_lim[:, None] - sliding_window
            s = jnp.where(mask, s, MASK_VALUE)
        return _online_softmax_step(carry, s, v.astype(q.dtype), vs)

    carry = (jnp.zeros((rows, head_dim), jnp.float32),
             jnp.full((rows,), MASK_VALUE, jnp.float32),
             jnp.zeros((rows,), jnp.float32))
    if prefetch:
        # Software double buffering: the next tile's loads are issued before
        # this tile's math, so they are in flight while it runs.
        def prefetched_body(b, c):
            acc, k, v = c[:3], c[3], c[4]
            k_next, v_next = load(jnp.minimum(b + 1, end - 1))
            return (*attend(b, acc, k, v, True), k_next, v_next)
        k0, v0 = load(jnp.minimum(start, jnp.maximum(end - 1, 0)))
        o, m, l, _, _ = jax.lax.fori_loop(start, end, prefetched_body,
                                          (*carry, k0, v0))
    else:
        def body(b, c, masked):
            k, v = load(b)
            return attend(b, c, k, v, masked)
        # Whole blocks below kv_len need no mask; only the last one (and,
        # with a window, every block) does.
        full = start if sliding_window is not None else first_lim // bk
        mid = jnp.clip(full, start, end)
        carry = jax.lax.fori_loop(start, mid,
                                  functools.partial(body, masked=False), carry)
        o, m, l = jax.lax.fori_loop(mid, end,
                                    functools.partial(body, masked=True), carry)
    o_ref[...] = o
    m_ref[...] = m
    l_ref[...] = l


def decode_call(q_dec, k_pages, v_pages, kv_lens, block_tables, scales,
                 page_scales, *, sm_scale, sliding_window, logit_soft_cap,
                 pages_per_block, num_splits, prefetch, num_warps, num_stages,
                 interpret, q_lens=None, query_tokens=1, group=1):
    """``page_scales``: [K, 2, num_pages] per-page (k, v) scales, or None.
    ``q_lens`` [S], ``query_tokens``, ``group``: several query tokens per
    sequence, their rows token-major (see decode_kernel)."""
    # Imported here: a CPU process never builds Triton kernels, and the
    # lowering is a noticeable part of its start-up imports.
    from jax.experimental.pallas import triton as plgpu
    num_seqs, num_kv_heads, rows, head_dim = q_dec.shape
    _, num_pages, page_size, _ = k_pages.shape
    pages_padded = block_tables.shape[1]
    page_scales, per_page = _page_scales_or_dummy(page_scales, num_kv_heads)
    kernel = functools.partial(
        decode_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, pages_per_block=pages_per_block,
        num_splits=num_splits, prefetch=prefetch, per_page_scales=per_page,
        query_tokens=query_tokens, group=group)
    if q_lens is None:
        q_lens = jnp.ones_like(kv_lens)
    part = (num_seqs, num_kv_heads, num_splits)
    pages_spec = pl.BlockSpec((None, num_pages, page_size, head_dim),
                              lambda s, k, j: (k, 0, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(num_seqs, num_kv_heads, num_splits),
        in_specs=[
            pl.BlockSpec((num_seqs,), lambda s, k, j: (0,)),
            pl.BlockSpec((num_seqs,), lambda s, k, j: (0,)),
            pl.BlockSpec((None, pages_padded), lambda s, k, j: (s, 0)),
            pl.BlockSpec((2,), lambda s, k, j: (0,)),
            pl.BlockSpec((None, 2, page_scales.shape[-1]),
                         lambda s, k, j: (k, 0, 0)),
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
    )(kv_lens, q_lens.astype(jnp.int32), block_tables, scales, page_scales,
      q_dec, k_pages, v_pages)


def _page_scales_or_dummy(page_scales, num_kv_heads):
    """(array, per_page): without per-page scales the kernels get a [K, 2, 1]
    placeholder they never read (one kernel signature for both)."""
    if page_scales is None:
        return jnp.ones((num_kv_heads, 2, 1), jnp.float32), False
    return page_scales.astype(jnp.float32), True


def combine_splits(o, m, l):
    """Merges the split partial softmaxes: [S, K, J, Gp, H] -> [S, K, Gp, H]."""
    m_max = m.max(axis=2, keepdims=True)
    w = jnp.exp2(m - m_max)  # [S, K, J, Gp]
    denom = (w * l).sum(axis=2)
    num = (w[..., None] * o).sum(axis=2)
    return num / jnp.where(denom > 0, denom, 1.0)[..., None]


# ---------------------------------------------------------------- prefill ---

def prefill_kernel(
    item_seq_ref,  # [I] int32 sequence of each work item
    item_start_ref,  # [I] int32 first query row of the item; -1 = no work
    cu_q_lens_ref,  # [S + 1] int32
    kv_lens_ref,  # [S] int32
    block_tables_ref,  # [S, P_pad] int32
    scales_ref,  # [2] f32 (k_scale, v_scale)
    page_scales_ref,  # [2, num_pages] f32 this kv head's per-page (k, v) scales
    q_ref,  # [T, H] this query head
    k_pages_ref,  # [num_pages, B, H] this head's kv head
    v_pages_ref,  # [num_pages, B, H]
    o_init_ref,  # [T, H] aliased with o_ref (decode rows, zeros elsewhere)
    o_ref,  # [T, H]
    *, sm_scale, sliding_window, logit_soft_cap, block_q, pages_per_block,
    per_page_scales):
    # Imported here: a CPU process never builds Triton kernels, and the
    # lowering is a noticeable part of its start-up imports.
    from jax.experimental.pallas import triton as plgpu
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
            ks = vs = None
            if per_page_scales:
                ks, vs = _token_scales(page_scales_ref, pages, page_size)
            s = _logits(q, k, sm_scale, scales_ref[0], logit_soft_cap, ks)
            if masked:
                kv_pos = b * bk + jnp.arange(bk, dtype=jnp.int32)
                mask = kv_pos[None, :] <= pos[:, None]
                if sliding_window is not None:
                    mask &= kv_pos[None, :] > pos[:, None] - sliding_window
                s = jnp.where(mask, s, MASK_VALUE)
            return _online_softmax_step(carry, s, v, vs)

        carry = (jnp.zeros((block_q, head_dim), jnp.float32),
                 jnp.full((block_q,), MASK_VALUE, jnp.float32),
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


def prefill_call(q, k_pages, v_pages, o_init, item_seq, item_start,
                  cu_q_lens, kv_lens, block_tables, scales, page_scales, *,
                  sm_scale, sliding_window, logit_soft_cap, block_q,
                  pages_per_block, num_warps, num_stages, interpret):
    """``page_scales``: [K, 2, num_pages] per-page (k, v) scales, or None."""
    # Imported here: a CPU process never builds Triton kernels, and the
    # lowering is a noticeable part of its start-up imports.
    from jax.experimental.pallas import triton as plgpu
    num_rows, num_q_heads, head_dim = q.shape
    num_kv_heads, num_pages, page_size, _ = k_pages.shape
    group = num_q_heads // num_kv_heads
    page_scales, per_page = _page_scales_or_dummy(page_scales, num_kv_heads)
    kernel = functools.partial(
        prefill_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, block_q=block_q,
        pages_per_block=pages_per_block, per_page_scales=per_page)
    full = lambda x: pl.BlockSpec(x.shape, lambda n, i: (0,) * x.ndim)
    rows_spec = pl.BlockSpec((num_rows, None, head_dim), lambda n, i: (0, n, 0))
    pages_spec = pl.BlockSpec((None, num_pages, page_size, head_dim),
                              lambda n, i: (n // group, 0, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(num_q_heads, item_seq.shape[0]),
        in_specs=[full(item_seq), full(item_start), full(cu_q_lens),
                  full(kv_lens), full(block_tables), full(scales),
                  pl.BlockSpec((None, 2, page_scales.shape[-1]),
                               lambda n, i: (n // group, 0, 0)),
                  rows_spec, pages_spec, pages_spec, rows_spec],
        out_specs=rows_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        input_output_aliases={10: 0},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps,
                                             num_stages=num_stages),
        interpret=interpret,
        name="ragged_paged_attention_prefill",
    )(item_seq, item_start, cu_q_lens, kv_lens, block_tables, scales,
      page_scales, q, k_pages, v_pages, o_init)


def prefill_work_items(cu_q_lens, num_seqs, num_items, block_q):
    """Splits every prefill sequence (q_len > 1) into block_q-row items:
    (item_seq [I], item_start [I], -1 where the item is unused)."""
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    real = jnp.arange(q_lens.shape[0]) < num_seqs
    seq, start, _ = sequence_work_items(cu_q_lens[:-1], cu_q_lens[1:],
                                        real & (q_lens > 1), block_q, num_items)
    return seq, start
