"""Decode attention over the paged KV pool in Pallas Mosaic GPU (Hopper).

The decode half of ``ragged_paged_attention`` (query length 1) as a Mosaic
GPU kernel; ``ragged_paged_attention.py`` calls it on Hopper for the cases it
takes (``supports``: bf16/f16, pages of 16 tokens, head dims 64/128/256, GQA
groups up to 64) and keeps its Triton decode kernel for the rest.

Grid (S, K, J): one program per (sequence, kv head, KV split). It serves the
whole GQA group, so each K/V page is read once for all of the group's query
heads: the group's rows (padded to the 64-row wgmma tile) are multiplied
against each step's K tile and the probabilities against its V tile on the
tensor cores (decode is memory bound: the padding costs tensor-core time,
not bytes).

Memory pipeline, the reason this kernel exists (the Triton kernel's in-loop
page gather kept too few bytes in flight, see NOTES.md): the program's slice
of the block table is TMA-copied to shared memory once; then every page is
its own TMA copy (gmem -> smem, page id read from that table) into a ring of
``num_stages`` steps of ``tokens_per_step`` tokens, each step's K (and V)
copies completing on one mbarrier. By default a producer warpgroup issues the
copies, refilling a slot as soon as the consumer warpgroup (wgmma + online
softmax) releases it; with ``producer_warpgroup=False`` one warpgroup does
both. NOTES.md v4 and v7 give the share of copy bandwidth it reaches.

Split-KV (flash-decoding): the split count comes from S*K and the SM count;
each split writes its normalized partial output and base-2 log-sum-exp and a
jnp combine merges them (skipped when J = 1).

Softmax in base 2 with a finite mask value, as the Triton kernels; sliding
window and logit soft-cap as in the reference. ``k_scale`` is folded into the
query rows by the caller, ``v_scale`` applied to the output.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .kernel_common import (LOG2E, MASK_VALUE, TABLE_PIECE, cdiv,
                            mosaic_interpret_params, mosaic_matmul_helpers,
                            mosaic_operand_problem, mosaic_register_helpers,
                            round_up, swizzled_smem_transforms, table_pieces)
from .ragged_paged_attention_tuning import MOSAIC_ROWS, MosaicDecodeTuning

_ROWS = MOSAIC_ROWS  # wgmma tile height: the GQA group is padded to it
# Rows of one K/V TMA copy (a page of 16 is one copy).
_COPY_ROWS = 16
# Page sizes verified on GPU. Page 32 faulted with an illegal instruction on
# jax 0.11.2 at the automatic ring depth on long sequences (NOTES.md v4) but
# ran correctly on short ones with a 2-stage ring (v9); it stays on the
# Triton kernel until the faulting settings pass.
_PAGE_SIZES = (16,)


class _Buffers(NamedTuple):
    """The kernel's shared-memory buffers (one scoped allocation)."""
    q: Any  # [64, H] the group's query rows, then the output rows
    k: Any  # [num_stages, bk, H] K ring, bk = pages_per_step * B
    v: Any  # [num_stages, bk, H] V ring
    table: Any  # [table_chunk] int32 the program's block-table slice
    lse: Any  # [64] f32 the split's base-2 log-sum-exp


class _Barriers(NamedTuple):
    """The kernel's barriers, in allocation order."""
    q: Any  # [1] the query rows landed
    table: Any  # [1] the block-table slice landed (one arrival per piece)
    k_ready: Any  # [num_stages] a ring slot's K pages landed
    v_ready: Any  # [num_stages] a ring slot's V pages landed
    free: Any  # [num_stages] the consumer released a slot (producer mode)


class MosaicDecodeUnsupported(ValueError):
    """A case the Mosaic GPU decode kernel does not take (the caller falls
    back to the Triton kernel); the message says why."""


def supports(q_dtype, kv_dtype, head_dim: int, page_size: int, group: int,
             tokens_per_step: int = 64) -> str | None:
    """None if the kernel takes this case, else the reason it does not."""
    why = mosaic_operand_problem(q_dtype, kv_dtype, head_dim)
    if why:
        return why
    if page_size not in _PAGE_SIZES or tokens_per_step % page_size:
        return (f"page size {page_size} (verified on GPU: {_PAGE_SIZES}, "
                "dividing the step)")
    if group > _ROWS:
        return f"GQA group {group} > {_ROWS}"
    return None


def _decode_kernel(
    kv_lens_ref,  # [S] int32; 0 for rows with no decode work
    tables_ref,  # [S, W] int32 page ids, zero padded past P
    q_ref,  # [S, K, R, H] the group's query rows (k_scale folded in)
    k_pages_ref,  # [K, num_pages, B, H]
    v_pages_ref,  # [K, num_pages, B, H]
    o_ref,  # [S, K, J, R, H] normalized partial output of each split
    lse_ref,  # [S, K, J, 64] f32 base-2 log-sum-exp of each split
    *, sm_scale, sliding_window, logit_soft_cap, pages_per_step, num_stages,
    num_splits, table_chunk, producer, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    cast, iota = mosaic_register_helpers(interpret)
    qk, pv = mosaic_matmul_helpers(interpret)

    seq = lax.axis_index("seq")
    kv_head = lax.axis_index("kv_head")
    split = lax.axis_index("split")
    rows_out, head_dim = q_ref.shape[2:]
    page_size = k_pages_ref.shape[2]
    bk = pages_per_step * page_size
    dtype = q_ref.dtype

    # This program's steps: [start, start + n) of the sequence's bk blocks.
    kv_len = kv_lens_ref[seq]
    num_blocks = lax.div(kv_len + (bk - 1), bk)
    lo = jnp.int32(0)
    if sliding_window is not None:
        lo = lax.div(jnp.maximum(kv_len - sliding_window, 0), bk)
    per_split = lax.div(num_blocks - lo + (num_splits - 1), num_splits)
    start = lo + split * per_split
    n = jnp.maximum(jnp.minimum(start + per_split, num_blocks) - start, 0)

    # The table slice [tbl_start, + table_chunk) holds this program's pages
    # from offset tbl_shift on (the slice is kept inside the table).
    tbl_start = jnp.minimum(start * pages_per_step,
                            tables_ref.shape[1] - table_chunk)
    tbl_shift = start * pages_per_step - tbl_start

    transforms = swizzled_smem_transforms(dtype)
    num_pieces, piece = table_pieces(table_chunk)

    def scoped(buffers: _Buffers, barriers: _Barriers):
        q_smem, k_smem, v_smem, tbl_smem, lse_smem = buffers
        q_bar, tbl_bar, k_bar, v_bar, free_bar = barriers

        def load_table():
            @pl.when(n > 0)
            def _():
                for c in range(num_pieces):
                    plgpu.copy_gmem_to_smem(
                        tables_ref.at[seq, pl.ds(tbl_start + c * piece,
                                                 piece)],
                        tbl_smem.at[pl.ds(c * piece, piece)], tbl_bar.at[0])

        def issue(i, slot):
            """Step i's pages -> ring slot `slot`, one TMA copy per page."""
            pages = [tbl_smem[tbl_shift + i * pages_per_step + j]
                     for j in range(pages_per_step)]
            for pages_ref, smem, bar in ((k_pages_ref, k_smem, k_bar),
                                         (v_pages_ref, v_smem, v_bar)):
                for j, page in enumerate(pages):
                    for r in range(0, page_size, _COPY_ROWS):
                        plgpu.copy_gmem_to_smem(
                            pages_ref.at[kv_head, page,
                                         pl.ds(r, _COPY_ROWS)],
                            smem.at[slot, pl.ds(j * page_size + r,
                                                _COPY_ROWS)],
                            bar.at[slot])

        def fill_ring():
            @pl.when(n > 0)
            def _():
                plgpu.barrier_wait(tbl_bar.at[0])
                for i in range(num_stages):
                    pl.when(i < n)(functools.partial(issue, i, i))

        def consume(refill):
            """The query rows, then the attention loop over the ring;
            ``refill(i, slot)`` runs once step i's tiles are consumed."""
            q_smem[...] = cast(jnp.zeros((_ROWS, head_dim), dtype),
                               plgpu.Layout.WGMMA)
            plgpu.commit_smem()
            plgpu.copy_gmem_to_smem(q_ref.at[seq, kv_head],
                                    q_smem.at[pl.ds(0, rows_out)], q_bar.at[0])
            plgpu.barrier_wait(q_bar.at[0])
            acc = cast(jnp.zeros((_ROWS, head_dim), jnp.float32),
                       plgpu.Layout.WGMMA)
            m = cast(jnp.full((_ROWS,), MASK_VALUE, jnp.float32),
                     plgpu.Layout.WGMMA.reduce(1))
            l = cast(jnp.zeros((_ROWS,), jnp.float32),
                     plgpu.Layout.WGMMA.reduce(1))
            body = functools.partial(_attend_step, refill=refill)
            # Only the last block (and, with a window, every block) needs a
            # mask.
            n_full = jnp.int32(0)
            if sliding_window is None:
                n_full = jnp.minimum(jnp.maximum(num_blocks - 1 - start, 0), n)
            carry = lax.fori_loop(0, n_full,
                                  functools.partial(body, masked=False),
                                  (acc, m, l))
            acc, m, l = lax.fori_loop(n_full, n,
                                      functools.partial(body, masked=True),
                                      carry)
            # l >= 1 once any block was seen (its max contributes exp2(0));
            # l == 0 only for an empty split, whose output is zeros.
            l = jnp.maximum(l, 1.0)
            acc = acc / lax.broadcast_in_dim(l, acc.shape, [0])
            q_smem[...] = acc.astype(dtype)
            lse_smem[...] = m + jnp.log2(l)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem.at[pl.ds(0, rows_out)],
                                    o_ref.at[seq, kv_head, split])
            plgpu.copy_smem_to_gmem(lse_smem,
                                    lse_ref.at[seq, kv_head, split])
            plgpu.wait_smem_to_gmem(0)

        def _attend_step(i, carry, masked, refill):
            acc, m, l = carry
            slot = lax.rem(i, num_stages)
            plgpu.barrier_wait(k_bar.at[slot])
            s = qk(q_smem, k_smem.at[slot], (_ROWS, bk))
            if logit_soft_cap is not None:
                s = jnp.tanh(s * (sm_scale / logit_soft_cap))
                s = s * (logit_soft_cap * LOG2E)
            else:
                s = s * (sm_scale * LOG2E)
            if masked:
                pos = (start + i) * bk + iota((_ROWS, bk), 1)
                valid = pos < kv_len
                if sliding_window is not None:
                    valid = valid & (pos >= kv_len - sliding_window)
                s = jnp.where(valid, s, MASK_VALUE)

            m_next = jnp.maximum(m, s.max(axis=1))
            alpha = jnp.exp2(m - m_next)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_next, s.shape, [0]))
            l = l * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            p = p.astype(dtype)

            plgpu.barrier_wait(v_bar.at[slot])

            acc = pv(acc, p, v_smem.at[slot])
            refill(i, slot)  # both tiles of this slot are consumed
            return acc, m_next, l

        if not producer:
            # One warpgroup: it refills a slot right after consuming it.
            def refill(i, slot):
                @pl.when(i + num_stages < n)
                def _():
                    issue(i + num_stages, slot)
            load_table()
            fill_ring()
            consume(refill)
            return

        # Two warpgroups: wg 1 only issues copies (a slot once wg 0 frees
        # it), wg 0 only computes.
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            if not interpret:
                plgpu.set_max_registers(232, action="increase")

            def release(i, slot):
                # Only slots the producer refills: an arrival nobody waits
                # for would leave the barrier a phase ahead at exit.
                @pl.when(i + num_stages < n)
                def _():
                    plgpu.barrier_arrive(free_bar.at[slot])
            consume(release)

        @pl.when(wg == 1)
        def _():
            if not interpret:
                plgpu.set_max_registers(40, action="decrease")
            load_table()
            fill_ring()

            @pl.loop(0, jnp.maximum(n - num_stages, 0))
            def _(i):
                slot = lax.rem(i, num_stages)
                plgpu.barrier_wait(free_bar.at[slot])
                issue(i + num_stages, slot)

    ring = (num_stages, bk, head_dim)
    copies = bk // _COPY_ROWS  # TMA copies that fill one ring slot
    pl.run_scoped(
        scoped,
        _Buffers(
            q=plgpu.SMEM((_ROWS, head_dim), dtype, transforms=transforms),
            k=plgpu.SMEM(ring, dtype, transforms=transforms),
            v=plgpu.SMEM(ring, dtype, transforms=transforms),
            table=plgpu.SMEM((table_chunk,), jnp.int32),
            lse=plgpu.SMEM((_ROWS,), jnp.float32)),
        _Barriers(
            q=plgpu.Barrier(num_barriers=1),
            table=plgpu.Barrier(num_arrivals=num_pieces, num_barriers=1),
            k_ready=plgpu.Barrier(num_arrivals=copies, num_barriers=num_stages),
            v_ready=plgpu.Barrier(num_arrivals=copies, num_barriers=num_stages),
            free=plgpu.Barrier(num_barriers=num_stages)),
        **({"collective_axes": "wg"} if producer else {}),
    )


def decode_attention(
    q: jax.Array,  # [S, K, G, H] one decode row per sequence, grouped
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    kv_lens: jax.Array,  # [S] int32; 0 = no decode work for this row
    block_tables: jax.Array,  # [S, P] int32
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    tuning: MosaicDecodeTuning = MosaicDecodeTuning(),
    interpret: bool = False,
) -> jax.Array:  # [S, K, G, H] f32, normalized
    """Decode attention of one query row per sequence (see module doc).
    Raises ``MosaicDecodeUnsupported`` for cases the kernel does not take."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    num_seqs, num_kv_heads, group, head_dim = q.shape
    _, num_pages, page_size, _ = k_pages.shape
    pages_per_seq = block_tables.shape[1]
    why = supports(q.dtype, k_pages.dtype, head_dim, page_size, group,
                   tuning.tokens_per_step)
    if why:
        raise MosaicDecodeUnsupported(why)
    pages_per_step = tuning.tokens_per_step // page_size
    itemsize = jnp.dtype(q.dtype).itemsize
    num_stages = tuning.stages(head_dim, itemsize)
    max_steps = cdiv(pages_per_seq, pages_per_step)
    splits = tuning.splits(num_seqs, num_kv_heads, max_steps)
    # Pages one split may read: the table slice copied to smem (whole TMA
    # pieces of 32+ entries: a copy moves a multiple of 128 bytes).
    chunk = round_up(cdiv(max_steps, splits) * pages_per_step, 32)
    if chunk > TABLE_PIECE:
        chunk = round_up(chunk, TABLE_PIECE)
    # Every page a program reads lies in the table, and its slice is kept
    # inside it; the table is padded only when it is too narrow for a slice
    # or for TMA (row stride a multiple of 16 bytes, whole steps).
    tables = block_tables.astype(jnp.int32)
    width = max(round_up(max_steps * pages_per_step, 4), chunk)
    if width != pages_per_seq:
        tables = jnp.pad(tables, ((0, 0), (0, width - pages_per_seq)))
    rows_out = round_up(group, 8)
    q_rows = jnp.pad(q, ((0, 0), (0, 0), (0, rows_out - group), (0, 0)))

    kernel = functools.partial(
        _decode_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, pages_per_step=pages_per_step,
        num_stages=num_stages, num_splits=splits, table_chunk=chunk,
        producer=tuning.producer_warpgroup, interpret=interpret)
    part = (num_seqs, num_kv_heads, splits)
    kw = {}
    if interpret:
        kw["interpret"] = mosaic_interpret_params()
    else:
        kw["compiler_params"] = plgpu.CompilerParams(
            approx_math=True,
            unsafe_no_auto_barriers=tuning.no_auto_barriers)
    if tuning.producer_warpgroup:
        kw.update(num_threads=2, thread_name="wg")
    o, lse = plgpu.kernel(
        kernel,
        out_type=(jax.ShapeDtypeStruct((*part, rows_out, head_dim), q.dtype),
                  jax.ShapeDtypeStruct((*part, _ROWS), jnp.float32)),
        grid=(num_seqs, num_kv_heads, splits),
        grid_names=("seq", "kv_head", "split"),
        **kw,
    )(kv_lens.astype(jnp.int32), tables, q_rows, k_pages, v_pages)
    o = o[:, :, :, :group].astype(jnp.float32)
    if splits == 1:
        return o[:, :, 0]
    lse = lse[..., :group]  # [S, K, J, G]
    w = jnp.exp2(lse - lse.max(axis=2, keepdims=True))
    return (w[..., None] * o).sum(axis=2) / w.sum(axis=2)[..., None]
