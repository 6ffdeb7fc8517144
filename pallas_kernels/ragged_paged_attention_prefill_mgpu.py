"""Prefill attention over the paged KV pool in Pallas Mosaic GPU (Hopper).

The prefill half of ``ragged_paged_attention`` (sequences with ``q_len > 1``:
whole prompts, chunked prefill, prefix-cache hits alike) as a Mosaic GPU
kernel in FlashAttention-3 form. Semantics as the reference: sequence ``s``
owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``; query token ``i`` of
``q_len`` sits at position ``kv_len - q_len + i`` and attends causally to the
positions at or before it (optionally within a sliding window).

Grid (N, I): one program per (query head, work item); a work item is
``2 * block_q`` query rows of one sequence (``prefill_work_items``, heaviest
item first), query heads fastest so that the programs of one GQA group run
together and share the K/V tiles in L2. Three warpgroups per program:

* warpgroups 0 and 1 compute, ``block_q`` rows each: QK^T and PV on wgmma,
  online softmax in base 2 in registers, ping-ponged with a schedule barrier
  so that one's softmax overlaps the other's matmuls;
* warpgroup 2 only moves memory: it copies the sequence's block-table slice
  to shared memory once, then fills a ring of ``num_stages`` K/V steps of
  ``tokens_per_step`` tokens, every page its own TMA copy (a page is
  ``B x H`` contiguous elements of ``[K, num_pages, B, H]``) and all the page
  copies of a step completing on one barrier; a slot is refilled once both
  compute warpgroups have consumed it.

Only the steps on the causal diagonal (and, with a sliding window, all steps)
are masked. Query rows come straight from ``q [T, N, H]`` by TMA. Mosaic GPU
tiles a TMA box over [T, N, H] in 8-row tiles, so a box must start on a
multiple of 8 rows: an item starts at its rows rounded down to 8 (rows of the
neighbouring sequence, or past T, are computed and dropped). Outputs leave
through shared memory: a warpgroup whose ``block_q`` rows all belong to its
sequence stores them with one TMA copy; otherwise in 8-row chunks, where the
(at most two) chunks that straddle a sequence boundary go to a side buffer
``[S, 2, 8, N, H]``, so no row outside the sequence is written. Zero items
(``item_seq == -1``) write the padding rows' zeros. The wrapper's one small
scatter then places the boundary rows, each decode's row (``decode_out``,
from the decode kernel) and the at most 7 padding rows before the first zero
item: no pass over all T rows (a select pass over the output is a
noticeable share of the kernel's time, and Mosaic GPU kernels take no
input/output alias to avoid it).

Softmax in base 2 with a finite mask value (a step that masks a whole row
leaves garbage that the next real step's correction factor zeroes).
``k_scale`` multiplies the logits and ``v_scale`` the output, read from a
``[2]`` f32 operand at run time.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .kernel_common import (
    LOG2E,
    MASK_VALUE,
    TABLE_PIECE,
    cdiv,
    mosaic_interpret_params,
    mosaic_matmul_helpers,
    mosaic_operand_problem,
    mosaic_register_helpers,
    per_tensor_scales,
    round_up,
    sequence_work_items,
    swizzled_smem_transforms,
    table_pieces,
)
from .ragged_paged_attention_tuning import MosaicPrefillTuning

_SMEM_LIMIT = 227 * 1024  # shared memory one Hopper block may use
__all__ = ["MosaicPrefillTuning", "MosaicPrefillUnsupported", "supports",
           "prefill_attention", "prefill_work_items"]


class _Buffers(NamedTuple):
    """The kernel's shared-memory buffers (one scoped allocation)."""
    q: Any  # [2, block_q, H] each compute warpgroup's query rows, then output
    k: Any  # [num_stages, bk, H] K ring, bk = pages_per_step * B
    v: Any  # [num_stages, bk, H] V ring
    table: Any  # [table_chunk] int32 the sequence's block-table slice


class _Barriers(NamedTuple):
    """The kernel's barriers, in allocation order."""
    q: Any  # [2] one per compute warpgroup: its query rows landed
    table: Any  # [1] the block-table slice landed (one arrival per piece)
    k_ready: Any  # [num_stages] a ring slot's K pages landed
    v_ready: Any  # [num_stages] a ring slot's V pages landed
    k_free: Any  # [num_stages] both compute warpgroups consumed a K slot
    v_free: Any  # [num_stages] both compute warpgroups consumed a V slot
    schedule: Any  # the compute warpgroups' ping-pong


class MosaicPrefillUnsupported(ValueError):
    """A case the Mosaic GPU prefill kernel does not take (the caller falls
    back to the Triton kernel); the message says why."""


def supports(q_dtype: jax.typing.DTypeLike, kv_dtype: jax.typing.DTypeLike,
             head_dim: int, page_size: int,
             tuning: MosaicPrefillTuning = MosaicPrefillTuning(),  # noqa: B008 - frozen
             pages_per_seq: int = 0) -> str | None:
    """None if the kernel takes this case, else the reason it does not."""
    why = mosaic_operand_problem(q_dtype, kv_dtype, head_dim)
    if why:
        return why
    if page_size % 8 or tuning.tokens_per_step % page_size:
        return (f"page size {page_size} (a multiple of 8 dividing "
                f"tokens_per_step={tuning.tokens_per_step})")
    need = tuning.smem_bytes(head_dim, 2, _table_chunk(
        pages_per_seq, tuning.tokens_per_step // page_size))
    if need > _SMEM_LIMIT:
        return f"{need} bytes of shared memory (> {_SMEM_LIMIT})"
    return None


def _table_chunk(pages_per_seq: int, pages_per_step: int) -> int:
    """Block-table entries one program copies to smem: whole TMA pieces of
    32+ entries (a copy moves a multiple of 128 bytes)."""
    chunk = round_up(max(1, round_up(pages_per_seq, pages_per_step)), 32)
    return round_up(chunk, TABLE_PIECE) if chunk > TABLE_PIECE else chunk


def _prefill_kernel(
    item_seq_ref,  # [I] int32 sequence of each work item; -1 = zero rows
    item_start_ref,  # [I] int32 first query row of the item; -1 = no work
    cu_q_lens_ref,  # [S + 1] int32
    kv_lens_ref,  # [S] int32
    tables_ref,  # [S, W] int32 page ids, zero padded past P
    scales_ref,  # [2] f32 (k_scale, v_scale)
    q_ref,  # [T, N, H]
    k_pages_ref,  # [K, num_pages, B, H]
    v_pages_ref,  # [K, num_pages, B, H]
    o_ref,  # [T, N, H] prefill rows written, others left as they are
    side_ref,  # [S, 2, 8, N, H] each sequence's first and last 8-row chunk
    *, sm_scale, sliding_window, logit_soft_cap, block_q, pages_per_step,
    num_stages, table_chunk, schedule_barrier, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    cast, iota = mosaic_register_helpers(interpret)
    qk, pv = mosaic_matmul_helpers(interpret)

    head = lax.axis_index("head")
    item = lax.axis_index("item")
    wg = lax.axis_index("wg")
    num_q_heads, head_dim = q_ref.shape[1:]
    group = num_q_heads // k_pages_ref.shape[0]
    page_size = k_pages_ref.shape[2]
    bk = pages_per_step * page_size
    dtype = q_ref.dtype
    tile = 2 * block_q

    # TMA boxes over q and the output move whole 8-row tiles of [T, N, H]:
    # items start on a multiple of 8 (rows before the sequence are computed
    # and dropped).
    start = pl.multiple_of(item_start_ref[item], 8)
    seq_or_zero = item_seq_ref[item]  # -1: a padding item, write zeros
    zero_item = seq_or_zero < 0
    seq = jnp.maximum(seq_or_zero, 0)
    q_begin = cu_q_lens_ref[seq]
    q_end = cu_q_lens_ref[seq + 1]
    kv_len = kv_lens_ref[seq]
    offset = kv_len - (q_end - q_begin) - q_begin  # position = row + offset
    last_row = jnp.minimum(start + tile, q_end) - 1
    hi = lax.div(last_row + offset + bk, bk)  # steps [lo, hi) of this program
    lo = jnp.int32(0)
    if sliding_window is not None:
        first = jnp.maximum(start, q_begin) + offset
        lo = lax.div(jnp.maximum(first - sliding_window + 1, 0), bk)
    kv_head = lax.div(head, group)

    transforms = swizzled_smem_transforms(dtype)
    num_pieces, piece = table_pieces(table_chunk)

    def scoped(buffers: _Buffers, barriers: _Barriers) -> None:
        q_smem, k_smem, v_smem, tbl_smem = buffers
        q_bar, tbl_bar, k_bar, v_bar, k_free, v_free, sched = barriers

        def sched_sync():
            if schedule_barrier:
                plgpu.barrier_arrive(sched)
                plgpu.barrier_wait(sched)

        def release(free, b, slot):
            """Frees step b's slot for the memory warpgroup, which refills
            (and so waits on) a slot only for steps b + num_stages < hi: an
            arrival past those would leave the barrier a phase ahead."""
            @pl.when(b + num_stages < hi)
            def _():
                plgpu.barrier_arrive(free.at[slot])

        @pl.when((start >= 0) & zero_item & (wg < 2))
        def _zeros():  # padding rows past the last sequence
            o_smem = q_smem.at[wg]
            o_smem[...] = cast(jnp.zeros((block_q, head_dim), dtype),
                               plgpu.Layout.WGMMA)
            plgpu.commit_smem()
            for c in range(block_q // 8):
                r = pl.multiple_of(start + wg * block_q + 8 * c, 8)
                pl.when(r + 8 <= o_ref.shape[0])(
                    lambda: plgpu.copy_smem_to_gmem(
                        o_smem.at[pl.ds(8 * c, 8)],
                        o_ref.at[pl.ds(r, 8), head]))
            plgpu.wait_smem_to_gmem(0)

        @pl.when((start >= 0) & ~zero_item & (wg < 2))
        def _compute():
            if not interpret:
                plgpu.set_max_registers(232, action="increase")
            row0 = start + wg * block_q
            wg_last = jnp.minimum(row0 + block_q, q_end) - 1
            wg_hi = lax.div(wg_last + offset + bk, bk)
            # Steps wholly at or before this warpgroup's first position need
            # no causal mask; the diagonal ones (and, with a window, all) do.
            full = lo
            if sliding_window is None:
                full = jnp.clip(lax.div(row0 + offset + 1, bk), lo, wg_hi)
            qk_scale = sm_scale * scales_ref[0]

            plgpu.copy_gmem_to_smem(q_ref.at[pl.ds(row0, block_q), head],
                                    q_smem.at[wg], q_bar.at[wg])
            plgpu.barrier_wait(q_bar.at[wg])
            acc = cast(jnp.zeros((block_q, head_dim), jnp.float32),
                       plgpu.Layout.WGMMA)
            m = cast(jnp.full((block_q,), MASK_VALUE, jnp.float32),
                     plgpu.Layout.WGMMA.reduce(1))
            l = cast(jnp.zeros((block_q,), jnp.float32),
                     plgpu.Layout.WGMMA.reduce(1))
            plgpu.barrier_wait(k_bar.at[0])  # hi > lo: every item has a step
            pl.when(wg == 1)(sched_sync)

            def step(b, carry, masked):
                acc, m, l = carry
                slot = lax.rem(b - lo, num_stages)

                s = qk(q_smem.at[wg], k_smem.at[slot], (block_q, bk),
                       then=sched_sync)
                release(k_free, b, slot)

                if logit_soft_cap is not None:
                    s = jnp.tanh(s * (qk_scale / logit_soft_cap))
                    s = s * (logit_soft_cap * LOG2E)
                    masked_s = True
                elif masked:
                    s = s * (qk_scale * LOG2E)
                    masked_s = True
                else:  # scaled inside the exp2 below (one FMA per logit)
                    masked_s = False
                if masked:
                    pos = row0 + offset + iota((block_q, bk), 0)
                    kv_pos = b * bk + iota((block_q, bk), 1)
                    ok = kv_pos <= pos
                    if sliding_window is not None:
                        ok = ok & (kv_pos > pos - sliding_window)
                    s = jnp.where(ok, s, MASK_VALUE)
                if masked_s:
                    m_next = jnp.maximum(m, s.max(axis=1))
                    p = jnp.exp2(s - lax.broadcast_in_dim(m_next, s.shape, [0]))
                else:
                    c = qk_scale * LOG2E
                    m_next = jnp.maximum(m, s.max(axis=1) * c)
                    p = jnp.exp2(s * c - lax.broadcast_in_dim(m_next, s.shape,
                                                              [0]))
                alpha = jnp.exp2(m - m_next)
                acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                l = l * alpha + p.sum(axis=1)
                p = p.astype(dtype)
                if schedule_barrier:
                    plgpu.barrier_arrive(sched)  # softmax done
                plgpu.barrier_wait(v_bar.at[slot])
                if schedule_barrier:
                    plgpu.barrier_wait(sched)  # the tensor cores are free

                def wait_next():
                    @pl.when(b + 1 < wg_hi)
                    def _():
                        plgpu.barrier_wait(k_bar.at[lax.rem(b + 1 - lo,
                                                            num_stages)])

                acc = pv(acc, p, v_smem.at[slot])
                wait_next()
                release(v_free, b, slot)
                return acc, m_next, l

            carry = lax.fori_loop(lo, full, functools.partial(
                step, masked=False), (acc, m, l))
            acc, m, l = lax.fori_loop(full, wg_hi, functools.partial(
                step, masked=True), carry)

            # Warpgroup 0 may end before warpgroup 1: it still releases the
            # slots of the steps it skips, in step with warpgroup 1.
            @pl.loop(wg_hi, hi)
            def _(b):
                slot = lax.rem(b - lo, num_stages)
                release(k_free, b, slot)
                release(v_free, b, slot)
                sched_sync()
                sched_sync()
            pl.when(wg == 0)(sched_sync)

            # l >= 1 for every real row (its own position is always visible).
            inv = scales_ref[1] / jnp.maximum(l, 1e-30)
            acc = acc * lax.broadcast_in_dim(inv, acc.shape, [0])
            o_smem = q_smem.at[wg]  # q is no longer needed
            o_smem[...] = acc.astype(dtype)
            plgpu.commit_smem()

            @pl.when((row0 >= q_begin) & (row0 + block_q <= q_end))
            def _():  # all rows are the sequence's: one copy
                plgpu.copy_smem_to_gmem(o_smem,
                                        o_ref.at[pl.ds(row0, block_q), head])

            @pl.when((row0 < q_begin) | (row0 + block_q > q_end))
            def _():  # 8-row chunks; the two that straddle a sequence
                for c in range(block_q // 8):  # boundary go to side_ref
                    r = pl.multiple_of(row0 + 8 * c, 8)
                    src = o_smem.at[pl.ds(8 * c, 8)]
                    pl.when((r >= q_begin) & (r + 8 <= q_end))(
                        lambda: plgpu.copy_smem_to_gmem(
                            src, o_ref.at[pl.ds(r, 8), head]))
                    pl.when((r < q_begin) & (r + 8 > q_begin))(
                        lambda: plgpu.copy_smem_to_gmem(
                            src, side_ref.at[seq, 0, :, head]))
                    pl.when((r < q_end) & (r + 8 > q_end))(
                        lambda: plgpu.copy_smem_to_gmem(
                            src, side_ref.at[seq, 1, :, head]))
            plgpu.wait_smem_to_gmem(0)

        @pl.when((start >= 0) & ~zero_item & (wg == 2))
        def _memory():
            if not interpret:
                plgpu.set_max_registers(40, action="decrease")
            for c in range(num_pieces):
                plgpu.copy_gmem_to_smem(
                    tables_ref.at[seq, pl.ds(lo * pages_per_step + c * piece,
                                             piece)],
                    tbl_smem.at[pl.ds(c * piece, piece)], tbl_bar.at[0])
            plgpu.barrier_wait(tbl_bar.at[0])

            def issue(i, slot, pages_ref, smem, bar):
                """Step lo + i's pages -> ring slot, one TMA copy per page."""
                for j in range(pages_per_step):
                    page = tbl_smem[i * pages_per_step + j]
                    plgpu.copy_gmem_to_smem(
                        pages_ref.at[kv_head, page],
                        smem.at[slot, pl.ds(j * page_size, page_size)],
                        bar.at[slot])

            n = hi - lo
            for i in range(num_stages):
                @pl.when(i < n)
                def _():
                    issue(i, i, k_pages_ref, k_smem, k_bar)
                    issue(i, i, v_pages_ref, v_smem, v_bar)

            @pl.loop(0, jnp.maximum(n - num_stages, 0))
            def _(i):
                slot = lax.rem(i, num_stages)
                plgpu.barrier_wait(k_free.at[slot])
                issue(i + num_stages, slot, k_pages_ref, k_smem, k_bar)
                plgpu.barrier_wait(v_free.at[slot])
                issue(i + num_stages, slot, v_pages_ref, v_smem, v_bar)

    ring = (num_stages, bk, head_dim)
    pl.run_scoped(
        scoped,
        _Buffers(
            q=plgpu.SMEM((2, block_q, head_dim), dtype, transforms=transforms),
            k=plgpu.SMEM(ring, dtype, transforms=transforms),
            v=plgpu.SMEM(ring, dtype, transforms=transforms),
            table=plgpu.SMEM((table_chunk,), jnp.int32)),
        _Barriers(
            q=plgpu.Barrier(num_barriers=2),
            table=plgpu.Barrier(num_arrivals=num_pieces, num_barriers=1),
            k_ready=plgpu.Barrier(num_arrivals=pages_per_step,
                                  num_barriers=num_stages),
            v_ready=plgpu.Barrier(num_arrivals=pages_per_step,
                                  num_barriers=num_stages),
            k_free=plgpu.Barrier(num_arrivals=2, num_barriers=num_stages),
            v_free=plgpu.Barrier(num_arrivals=2, num_barriers=num_stages),
            schedule=plgpu.Barrier(num_arrivals=2)),
        collective_axes="wg",
    )


def prefill_work_items(
    cu_q_lens: jax.Array,  # [S + 1] int32
    num_seqs: jax.Array,  # [] or [1] int32 real sequences
    num_rows: int,
    num_items: int,
    tile: int,
) -> tuple[jax.Array, jax.Array]:  # item_seq [I], item_start [I]
    """Splits every prefill sequence (q_len > 1) into ``tile``-row items
    starting on a multiple of 8 (the first one from the sequence's first row
    rounded down), then the padding rows from the real rows' end rounded up
    to 8 up to ``num_rows`` into zero items: (item_seq [I] (-1 for a zero
    item), item_start [I] (-1 where the item is unused)). The last (heaviest,
    causal) item of each sequence comes first."""
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    real = jnp.arange(q_lens.shape[0]) < num_seqs
    seq, start, used = sequence_work_items(
        cu_q_lens[:-1] // 8 * 8, cu_q_lens[1:], real & (q_lens > 1), tile,
        num_items)
    zero_start = round_up(cu_q_lens[num_seqs], 8)
    num_zero = cdiv(num_rows - zero_start, tile)
    z = jnp.arange(num_items, dtype=jnp.int32) - used
    is_zero = (z >= 0) & (z < num_zero)
    start = jnp.where(is_zero, zero_start + z * tile, start)
    seq = jnp.where(is_zero, -1, seq)
    return seq, start.astype(jnp.int32)


def prefill_attention(
    q: jax.Array,  # [T, N, H]
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    kv_lens: jax.Array,  # [S] int32
    block_tables: jax.Array,  # [S, P] int32
    cu_q_lens: jax.Array,  # [S + 1] int32
    num_seqs: jax.Array,  # [] or [1] int32
    decode_out: jax.Array | None = None,  # [S, N, H] rows of the decodes
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    k_scale: jax.Array | float | None = None,
    v_scale: jax.Array | float | None = None,
    tuning: MosaicPrefillTuning = MosaicPrefillTuning(),  # noqa: B008 - frozen
    interpret: bool = False,
) -> jax.Array:  # [T, N, H]
    """Attention output [T, N, H]: the kernel's rows for the prefill
    sequences (q_len > 1), ``decode_out[s]`` at the row of each decode
    sequence s (q_len == 1; zeros when None), zeros for padding rows.
    Raises ``MosaicPrefillUnsupported`` for cases the kernel does not take.
    Call under jit."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    num_seq_rows, pages_per_seq = block_tables.shape
    why = supports(q.dtype, k_pages.dtype, head_dim, page_size, tuning,
                   pages_per_seq)
    if why:
        raise MosaicPrefillUnsupported(why)
    if num_q_heads % num_kv_heads:
        raise MosaicPrefillUnsupported(
            f"query heads ({num_q_heads}) not a multiple of kv heads "
            f"({num_kv_heads})")
    pages_per_step = tuning.tokens_per_step // page_size
    chunk = _table_chunk(pages_per_seq, pages_per_step)
    # Any program's slice [lo * pages_per_step, + chunk) stays in the table.
    width = round_up(pages_per_seq, pages_per_step) + chunk
    tables = jnp.pad(block_tables.astype(jnp.int32),
                     ((0, 0), (0, width - pages_per_seq)))
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    tile = 2 * tuning.block_q
    # TMA boxes over q and the output need the row count a multiple of the
    # 8-row smem tiling: pad (a copy) only when the step's T is not.
    rows = round_up(num_tokens, 8)
    if rows != num_tokens:
        q = jnp.pad(q, ((0, rows - num_tokens), (0, 0), (0, 0)))
    # Sequence items: at most one per tile of rows plus one per sequence;
    # zero items: at most one per tile of padding rows plus one.
    num_items = cdiv(rows, tile) + num_seq_rows + 2
    num_seqs = jnp.reshape(num_seqs, ())
    item_seq, item_start = prefill_work_items(cu_q_lens, num_seqs, rows,
                                              num_items, tile)
    scales = per_tensor_scales(k_scale, v_scale)

    kernel = functools.partial(
        _prefill_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, block_q=tuning.block_q,
        pages_per_step=pages_per_step, num_stages=tuning.num_stages,
        table_chunk=chunk, schedule_barrier=tuning.schedule_barrier,
        interpret=interpret)
    kw = {}
    if interpret:
        # TMA reads past the last query row fill; the interpreter fills
        # them with NaN (those rows are computed and dropped).
        kw["interpret"] = mosaic_interpret_params(
            out_of_bounds_reads="uninitialized")
    else:
        kw["compiler_params"] = plgpu.CompilerParams(approx_math=True)
    mesh = plgpu.Mesh(grid=(num_q_heads, num_items),
                      grid_names=("head", "item"), num_threads=3,
                      thread_name="wg")
    side_shape = (num_seq_rows, 2, 8, num_q_heads, head_dim)
    out, side = pl.kernel(
        kernel, mesh=mesh, name="ragged_paged_attention_prefill_mgpu",
        out_type=(jax.ShapeDtypeStruct(q.shape, q.dtype),
                  jax.ShapeDtypeStruct(side_shape, q.dtype)), **kw,
    )(item_seq, item_start, cu_q_lens, kv_lens.astype(jnp.int32), tables,
      scales, q, k_pages, v_pages)

    # Rows the kernel leaves, in one scatter (index `rows` = dropped):
    # the boundary chunks' rows of each prefill sequence (chunks
    # [first row // 8 * 8, + 8) and [last row // 8 * 8, + 8), written to
    # side only where the sequence's start / end is not 8-aligned), each
    # decode's row, and the padding rows before the first zero item.
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    real = jnp.arange(num_seq_rows) < num_seqs
    pre = real & (q_lens > 1)
    bases = jnp.stack([cu_q_lens[:-1] // 8 * 8,
                       (cu_q_lens[1:] - 1) // 8 * 8], axis=1)  # [S, 2]
    used = pre[:, None] & jnp.stack([cu_q_lens[:-1] % 8 != 0,
                                     cu_q_lens[1:] % 8 != 0], axis=1)
    idx = bases[:, :, None] + jnp.arange(8, dtype=jnp.int32)  # [S, 2, 8]
    ok = (used[:, :, None] & (idx >= cu_q_lens[:-1, None, None])
          & (idx < cu_q_lens[1:, None, None]))
    side_idx = jnp.where(ok, idx, rows).reshape(-1)
    dec_idx = jnp.where(real & (q_lens == 1), cu_q_lens[:-1], rows)
    if decode_out is None:
        decode_out = jnp.zeros((num_seq_rows, num_q_heads, head_dim), q.dtype)
    total = cu_q_lens[num_seqs]
    pad_idx = total + jnp.arange(8, dtype=jnp.int32)
    pad_idx = jnp.where(pad_idx < round_up(total, 8), pad_idx, rows)
    out = out.at[jnp.concatenate([side_idx, dec_idx, pad_idx])].set(
        jnp.concatenate([side.reshape(-1, num_q_heads, head_dim),
                         decode_out.astype(q.dtype),
                         jnp.zeros((8, num_q_heads, head_dim), q.dtype)]),
        mode="drop")
    return out[:num_tokens] if rows != num_tokens else out
