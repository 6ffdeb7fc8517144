"""Decode attention over the paged KV pool in Pallas Mosaic GPU (Hopper).

The decode half of ``ragged_paged_attention`` (query length 1) as a Mosaic
GPU kernel; ``ragged_paged_attention.py`` calls it on Hopper for the cases it
takes (``supports``: bf16/f16 queries over pages of the same dtype or of fp8
e4m3, pages of 16 tokens, head dims 64/128/256, GQA groups up to 64) and
keeps its Triton decode kernel for the rest.

Grid (S, K, J): one program per (sequence, kv head, KV split). It serves the
whole GQA group, so each K/V page is read once for all of the group's query
heads: the group's rows (padded to the 64-row wgmma tile) are multiplied
against each step's K tile and the probabilities against its V tile on the
tensor cores (decode is memory bound: the padding costs tensor-core time,
not bytes).

Memory pipeline, the reason this kernel exists (the Triton kernel's in-loop
page gather keeps too few bytes in flight): the program's slice
of the block table is TMA-copied to shared memory once; then every page is
its own TMA copy (gmem -> smem, page id read from that table) into a ring of
``num_stages`` steps of ``tokens_per_step`` tokens, each step's K (and V)
copies completing on one mbarrier. By default a producer warpgroup issues the
copies, refilling a slot as soon as the consumer warpgroup (wgmma + online
softmax) releases it; with ``producer_warpgroup=False`` one warpgroup does
both. pallas_kernels/NOTES.md records each version's measurements.

Split-KV (flash-decoding): the split count comes from S*K and the SM count;
each split writes its normalized partial output and base-2 log-sum-exp and a
jnp combine merges them (skipped when J = 1).

fp8 pages (float8_e4m3fn): Hopper's wgmma has no fp8 x bf16 form, so the
pages are copied into the ring as fp8 (half the bytes, the point of them)
and dequantized in shared memory: each 64-token tile is loaded into
registers, converted, multiplied row-wise by its page's scale and stored as
a 16-bit tile in the swizzled layout wgmma reads; the wgmma and online
softmax then run as for 16-bit pages. With a producer warpgroup the producer
dequantizes (``staging_stages`` K tiles and ``v_staging_stages`` V tiles
ahead of the consumer), so the convert
overlaps the consumer's math; ``fp8_producers=2`` splits that work over two
producer warpgroups, one copying and converting K, the other V (the convert,
not the consumer's math, bounds the kernel), and
``fp8_producers=4`` splits each kind again by 64-token half of every step
(five warpgroups, more warps to hide the convert's latency); with
one warpgroup alone it dequantizes V while the QK^T wgmma runs.

``swap_ab`` puts the tokens on the wgmmas' M side and the group's query
rows on N (S^T = K Q^T, O^T = V^T P^T), so the consumer's logits and output
are [tokens, R] and [H, R] with R the group rounded up to 16, 32 or 64
rather than 64-row padded tiles: far fewer registers, which four producers
need (``MosaicDecodeTuning.registers``). Per-page scales (``[K, num_pages]``, ``kv_cache.py``) come
as a ``[S, K, 2, W]`` gather beside the block table (the wrapper's one XLA
gather) and are TMA-copied to smem with the program's table slice.

Softmax in base 2 with a finite mask value, as the Triton kernels; sliding
window and logit soft-cap as in the reference. A per-tensor ``k_scale`` is
folded into the query rows by the caller, ``v_scale`` applied to the output.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
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
    round_up,
    swizzled_smem_transforms,
    table_pieces,
)
from .ragged_paged_attention_tuning import MOSAIC_ROWS, MosaicDecodeTuning

_ROWS = MOSAIC_ROWS  # wgmma tile height: the GQA group is padded to it
# Rows of one K/V TMA copy (a page of 16 is one copy).
_COPY_ROWS = 16
# Page sizes verified on GPU. Page 32 faults on the GPU at the automatic
# ring depth on long sequences (NOTES.md follows it), so it stays on the
# Triton kernel until it passes there.
_PAGE_SIZES = (16,)
# Page dtypes dequantized in the kernel (the KV cache writes e4m3 pages).
_FP8_PAGES = (jnp.dtype(jnp.float8_e4m3fn),)
# Registers per thread of a producer warpgroup that only issues copies
# (16-bit pages; the consumer takes 232). For fp8 pages it also holds a
# 64 x H tile being converted: ``MosaicDecodeTuning.registers`` splits them.
_PRODUCER_REGS = 40
# swap_ab: the query rows are wgmma's N, and their 16-bit tiles (the output
# is stored [H, R]) must be 32, 64 or 128 bytes wide (Mosaic's swizzles).
_SWAP_ROWS = (16, 32, 64)


class _Buffers(NamedTuple):
    """The kernel's shared-memory buffers (one scoped allocation)."""
    q: Any  # [64, H] the group's query rows, then the output rows
    k: Any  # [num_stages, bk, H] K ring (page dtype), bk = pages_per_step * B
    v: Any  # [num_stages, bk, H] V ring (page dtype)
    table: Any  # [table_chunk] int32 the program's block-table slice
    lse: Any  # [64] f32 the split's base-2 log-sum-exp
    # fp8 pages only (None otherwise):
    kb: Any = None  # [K staging, bk, H] dequantized K tiles (query dtype)
    vb: Any = None  # [V staging, bk, H] dequantized V tiles
    scales: Any = None  # [2, table_chunk] f32 per-page (k, v) scales
    # swap_ab only (then q is [R, H] and lse [round_up(R, 32)]):
    out: Any = None  # [H, R] the output rows, transposed
    p: Any = None  # [R, bk] a step's probabilities, PV's B operand


class _Barriers(NamedTuple):
    """The kernel's barriers, in allocation order."""
    q: Any  # [1] the query rows landed
    table: Any  # [1] the block-table slice (and its scales) landed
    k_ready: Any  # [num_stages] a ring slot's K pages landed
    v_ready: Any  # [num_stages] a ring slot's V pages landed
    free: Any  # [num_stages] the consumer released a slot (producer mode)
    # fp8 pages with a producer warpgroup only (None otherwise):
    kb_ready: Any = None  # [K staging] a dequantized K tile is stored
    vb_ready: Any = None  # [V staging] a dequantized V tile is stored
    kb_free: Any = None  # [K staging] the consumer's QK^T read a K tile
    vb_free: Any = None  # [V staging] the consumer's PV read a V tile


class MosaicDecodeUnsupported(ValueError):
    """A case the Mosaic GPU decode kernel does not take (the caller falls
    back to the Triton kernel); the message says why."""


def supports(q_dtype: jax.typing.DTypeLike, kv_dtype: jax.typing.DTypeLike,
             head_dim: int, page_size: int, group: int,
             tokens_per_step: int = 64,
             per_page_scales: bool = False) -> str | None:
    """None if the kernel takes this case, else the reason it does not."""
    fp8 = jnp.dtype(kv_dtype) in _FP8_PAGES
    if per_page_scales and not fp8:
        return (f"per-page K/V scales on {jnp.dtype(kv_dtype).name} pages "
                "(the Mosaic kernel reads them with fp8 e4m3 pages)")
    why = mosaic_operand_problem(q_dtype, q_dtype if fp8 else kv_dtype,
                                 head_dim)
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
    *refs,
    sm_scale, sliding_window, logit_soft_cap, pages_per_step, num_stages,
    num_splits, table_chunk, producer, staging, per_page, interpret,
    producers=1, probe="", overlap=False, swap_ab=False, registers=(232, 0)):
    # refs: [page_scales_ref  # [S, K, 2, W] f32 (k, v) scale of each table
    #        entry; per-page scales only]
    #       q_ref,  # [S, K, R, H] the group's query rows (k_scale folded in)
    #       k_pages_ref,  # [K, num_pages, B, H]
    #       v_pages_ref,  # [K, num_pages, B, H]
    #       o_ref,  # [S, K, J, R, H] normalized partial output of each split
    #               ([S, K, J, H, R] with swap_ab)
    #       lse_ref,  # [S, K, J, 64] f32 base-2 log-sum-exp of each split
    #                 ([S, K, J, round_up(R, 32)] with swap_ab)
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    page_scales_ref = refs[0] if per_page else None
    q_ref, k_pages_ref, v_pages_ref, o_ref, lse_ref = refs[per_page:]
    cast, iota = mosaic_register_helpers(interpret)
    qk, pv = mosaic_matmul_helpers(interpret)

    seq = lax.axis_index("seq")
    kv_head = lax.axis_index("kv_head")
    split = lax.axis_index("split")
    rows_out, head_dim = q_ref.shape[2:]
    page_size = k_pages_ref.shape[2]
    bk = pages_per_step * page_size
    dtype = q_ref.dtype
    # fp8 pages are dequantized into staging = (K, V) rings of 16-bit tiles
    # ((0, 0) for 16-bit pages).
    fp8 = staging[0] > 0

    kv_len = kv_lens_ref[seq]
    start, n, n_full, tbl_start, tbl_shift = _program_range(
        kv_len, split, bk=bk, num_splits=num_splits,
        sliding_window=sliding_window, pages_per_step=pages_per_step,
        table_width=tables_ref.shape[1], table_chunk=table_chunk)

    transforms = swizzled_smem_transforms(dtype)
    page_dtype = k_pages_ref.dtype
    ring_transforms = transforms if not fp8 else swizzled_smem_transforms(
        page_dtype, min(128, head_dim * jnp.dtype(page_dtype).itemsize))
    num_pieces, piece = table_pieces(table_chunk)

    def scoped(buffers: _Buffers, barriers: _Barriers) -> None:
        q_smem, k_smem, v_smem, tbl_smem, lse_smem = buffers[:5]
        q_bar, tbl_bar, k_bar, v_bar, free_bar = barriers[:5]

        def load_table():
            @pl.when(n > 0)
            def _():
                for c in range(num_pieces):
                    plgpu.copy_gmem_to_smem(
                        tables_ref.at[seq, pl.ds(tbl_start + c * piece,
                                                 piece)],
                        tbl_smem.at[pl.ds(c * piece, piece)], tbl_bar.at[0])
                    if page_scales_ref is None:
                        continue
                    for kind in range(2):  # k, v scales
                        plgpu.copy_gmem_to_smem(
                            page_scales_ref.at[seq, kv_head, kind,
                                               pl.ds(tbl_start + c * piece,
                                                     piece)],
                            buffers.scales.at[kind, pl.ds(c * piece, piece)],
                            tbl_bar.at[0])

        def issue(i, slot, kinds=(0, 1), chunks=None):
            """Step i's pages -> ring slot `slot`, one TMA copy per page, of
            K (kind 0) and V (1); only those of the step's 64-token
            ``chunks`` when given (a producer's share)."""
            mine: Sequence[int] = range(pages_per_step)
            if chunks is not None:
                per = _ROWS // page_size
                mine = [c * per + j for c in chunks for j in range(per)]
            pages = [(j, tbl_smem[tbl_shift + i * pages_per_step + j])
                     for j in mine]
            rings = ((k_pages_ref, k_smem, k_bar), (v_pages_ref, v_smem, v_bar))
            for pages_ref, smem, bar in (rings[kind] for kind in kinds):
                for j, page in pages:
                    for r in range(0, page_size, _COPY_ROWS):
                        plgpu.copy_gmem_to_smem(
                            pages_ref.at[kv_head, page,
                                         pl.ds(r, _COPY_ROWS)],
                            smem.at[slot, pl.ds(j * page_size + r,
                                                _COPY_ROWS)],
                            bar.at[slot])

        def fill_ring(kinds=(0, 1), chunks=None):
            @pl.when(n > 0)
            def _():
                plgpu.barrier_wait(tbl_bar.at[0])
                for i in range(num_stages):
                    pl.when(i < n)(functools.partial(issue, i, i, kinds,
                                                     chunks))

        def dequant(kind, i, src, dst, chunks=None):
            """Step i's fp8 tile ``src`` [bk, H] -> ``dst`` [bk, H] in the
            query dtype, each page's rows times its scale (kind 0: K, 1: V),
            or only its 64-row ``chunks``; then made visible to wgmma."""
            if chunks is None:
                chunks = range(bk // _ROWS)
            for c in (() if probe in ("no_convert", "copies_only")
                      else chunks):
                rows = pl.ds(c * _ROWS, _ROWS)
                x = cast(src.at[rows][...], plgpu.Layout.WGMMA_8BIT)
                # e4m3 -> f16 is one exact convert per pair; bf16 goes
                # through f32, where the scale is applied.
                work = jnp.float16 if dtype == jnp.float16 else jnp.float32
                x = x.astype(work)
                if per_page:
                    first = tbl_shift + i * pages_per_step + c * (
                        _ROWS // page_size)
                    x = x * _row_scales(
                        [buffers.scales[kind, first + j]
                         for j in range(_ROWS // page_size)],
                        page_size, head_dim, work, interpret)
                dst.at[rows][...] = cast(x.astype(dtype),
                                         plgpu.Layout.WGMMA_8BIT)
            plgpu.commit_smem()

        def consume(k_tile, during_qk, v_tile, done, after_qk=None):
            """The query rows, then the attention loop: step i's K tile is
            ``k_tile(i)`` -> (ref, slot), ``during_qk(i, slot)`` runs while
            its QK^T wgmma does and ``after_qk(i, slot)`` once it is done,
            its V tile is ``v_tile(i, slot)``, and ``done(i, slot)`` runs
            once both are consumed."""
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
            after_qk = after_qk or nothing
            if overlap and not probe:
                # Step i's softmax runs while step i + 1's QK^T wgmma does,
                # so its first QK^T comes before the loop: an empty split
                # (n == 0) must not wait for it.
                pl.when(n == 0)(lambda: finish(acc, m, l))

                @pl.when(n > 0)
                def _():
                    k_ref, slot = k_tile(jnp.int32(0))
                    s = qk(q_smem, k_ref, (_ROWS, bk))
                    after_qk(0, slot)
                    body = functools.partial(
                        _overlapped_step, k_tile=k_tile, v_tile=v_tile,
                        done=done, after_qk=after_qk)
                    last = n - 1
                    cut = jnp.minimum(n_full, last)
                    carry = lax.fori_loop(
                        0, cut, functools.partial(body, masked=False),
                        (acc, m, l, s, slot))
                    acc_, m_, l_, s, slot = lax.fori_loop(
                        cut, last, functools.partial(body, masked=True), carry)
                    p, m_, l_, acc_ = _softmax(last, s, m_, l_, acc_, True)
                    acc_ = pv(acc_, p, v_tile(last, slot))
                    done(last, slot)
                    finish(acc_, m_, l_)
                return
            body = functools.partial(_attend_step, k_tile=k_tile,
                                     during_qk=during_qk, v_tile=v_tile,
                                     done=done, after_qk=after_qk)
            run_steps(body, (acc, m, l))

        def run_steps(body, carry):
            """Steps [0, n_full) unmasked, the rest masked, then finish."""
            carry = lax.fori_loop(0, n_full,
                                  functools.partial(body, masked=False), carry)
            finish(*lax.fori_loop(n_full, n,
                                  functools.partial(body, masked=True),
                                  carry))

        def finish(acc, m, l):
            """The split's normalized output rows and log-sum-exp -> HBM
            (with swap_ab, acc is the transposed output [H, R])."""
            # l >= 1 once any block was seen (its max contributes exp2(0));
            # l == 0 only for an empty split, whose output is zeros.
            l = jnp.maximum(l, 1.0)
            acc = acc / lax.broadcast_in_dim(l, acc.shape, [int(swap_ab)])
            out = buffers.out if swap_ab else q_smem
            out[...] = acc.astype(dtype)
            lse = lse_smem.at[pl.ds(0, rows_out)] if swap_ab else lse_smem
            lse[...] = m + jnp.log2(l)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                out if swap_ab else out.at[pl.ds(0, rows_out)],
                o_ref.at[seq, kv_head, split])
            plgpu.copy_smem_to_gmem(lse_smem,
                                    lse_ref.at[seq, kv_head, split])
            plgpu.wait_smem_to_gmem(0)

        def _scaled(i, s, masked, token_axis=1):
            """Step i's raw logits -> base-2 logits, soft-capped, masked
            past the sequence (and outside the window) when ``masked``."""
            if logit_soft_cap is not None:
                s = jnp.tanh(s * (sm_scale / logit_soft_cap))
                s = s * (logit_soft_cap * LOG2E)
            else:
                s = s * (sm_scale * LOG2E)
            if masked:
                pos = (start + i) * bk + iota(s.shape, token_axis)
                valid = pos < kv_len
                if sliding_window is not None:
                    valid = valid & (pos >= kv_len - sliding_window)
                s = jnp.where(valid, s, MASK_VALUE)
            return s

        def _softmax(i, s, m, l, acc, masked):
            """Step i's logits ``s`` -> (its probabilities in the query
            dtype, the running max, sum and output rescaled to it)."""
            s = _scaled(i, s, masked)

            m_next = jnp.maximum(m, s.max(axis=1))
            alpha = jnp.exp2(m - m_next)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_next, s.shape, [0]))
            l = l * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            return p.astype(dtype), m_next, l, acc

        def _without_math(i, slot, v_tile, done, after_qk, carry):
            """A probe's step (measurement only): the tiles are waited for
            and released as in a real step, nothing is computed from them."""
            after_qk(i, slot)
            v_tile(i, slot)
            done(i, slot)
            return carry

        def _attend_step(i, carry, masked, k_tile, during_qk, v_tile, done,
                         after_qk):
            acc, m, l = carry
            k_ref, slot = k_tile(i)
            if probe in ("no_math", "copies_only"):
                return _without_math(i, slot, v_tile, done, after_qk, carry)
            s = qk(q_smem, k_ref, (_ROWS, bk),
                   functools.partial(during_qk, i, slot))
            after_qk(i, slot)
            p, m, l, acc = _softmax(i, s, m, l, acc, masked)
            acc = pv(acc, p, v_tile(i, slot))
            done(i, slot)  # both tiles of this step are consumed
            return acc, m, l

        def _overlapped_step(i, carry, masked, k_tile, v_tile, done,
                             after_qk):
            """Step i's softmax during step i + 1's QK^T, then step i's PV
            (``s`` holds step i's logits)."""
            acc, m, l, s, slot = carry
            k_ref, next_slot = k_tile(i + 1)
            s_next, (p, m, l, acc) = qk(
                q_smem, k_ref, (_ROWS, bk),
                lambda: _softmax(i, s, m, l, acc, masked), with_result=True)
            after_qk(i + 1, next_slot)
            acc = pv(acc, p, v_tile(i, slot))
            done(i, slot)
            return acc, m, l, s_next, next_slot

        def consume_swapped(k_tile, during_qk, v_tile, done, after_qk=None):
            """``consume`` with the tokens on the wgmmas' M side (swap_ab):
            S^T = K Q^T [bk, R], O^T = V^T P^T [H, R] with P^T stored
            K-major through ``buffers.p``, so the logits, probabilities and
            output take 16-64 columns instead of 64 padded rows."""
            plgpu.copy_gmem_to_smem(q_ref.at[seq, kv_head], q_smem,
                                    q_bar.at[0])
            plgpu.barrier_wait(q_bar.at[0])
            cols = plgpu.Layout.WGMMA.reduce(0)
            acc = cast(jnp.zeros((head_dim, rows_out), jnp.float32),
                       plgpu.Layout.WGMMA)
            m = cast(jnp.full((rows_out,), MASK_VALUE, jnp.float32), cols)
            l = cast(jnp.zeros((rows_out,), jnp.float32), cols)
            after_qk = after_qk or nothing

            def logits(k_ref, then):
                if interpret:
                    st = lax.dot_general(
                        k_ref[...].astype(jnp.float32),
                        q_smem[...].astype(jnp.float32),
                        (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32)
                    then()
                    return st

                def body(acc_ref):
                    plgpu.wgmma(acc_ref, k_ref, q_smem.transpose((1, 0)))
                    then()
                    return acc_ref[...]
                return pl.run_scoped(body, plgpu.ACC((bk, rows_out),
                                                     jnp.float32))

            def step(i, carry, masked):
                acc, m, l = carry
                k_ref, slot = k_tile(i)
                if probe in ("no_math", "copies_only"):
                    return _without_math(i, slot, v_tile, done, after_qk,
                                         carry)
                st = logits(k_ref, functools.partial(during_qk, i, slot))
                after_qk(i, slot)
                st = _scaled(i, st, masked, token_axis=0)
                m_next = jnp.maximum(m, st.max(axis=0))
                alpha = jnp.exp2(m - m_next)
                p = jnp.exp2(st - lax.broadcast_in_dim(m_next, st.shape, [1]))
                l = l * alpha + p.sum(axis=0)
                acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [1])
                v_ref = v_tile(i, slot)
                if interpret:
                    acc = acc + lax.dot_general(
                        v_ref[...].astype(jnp.float32),
                        p.astype(dtype).astype(jnp.float32),
                        (((0,), (0,)), ((), ())),
                        preferred_element_type=jnp.float32)
                else:
                    # P^T [bk, R] stored as P [R, bk]: K-major, PV's B
                    # operand.
                    buffers.p.transpose((1, 0))[...] = plgpu.layout_cast(
                        p.astype(dtype), plgpu.Layout.WGMMA_TRANSPOSED)
                    plgpu.commit_smem()

                    def pv_body(acc_ref):
                        plgpu.wgmma(acc_ref, v_ref.transpose((1, 0)),
                                    buffers.p.transpose((1, 0)))
                    acc = pl.run_state(pv_body)(plgpu.ACC.init(acc))
                done(i, slot)
                return acc, m_next, l

            run_steps(step, (acc, m, l))

        # Both consumers take the same tiles and hooks.
        attend = consume_swapped if swap_ab else consume

        def ring_k(i):
            slot = lax.rem(i, num_stages)
            plgpu.barrier_wait(k_bar.at[slot])
            return k_smem.at[slot], slot

        def ring_v(i, slot):
            plgpu.barrier_wait(v_bar.at[slot])
            return v_smem.at[slot]

        def nothing(i, slot):
            pass

        if not producer:
            # One warpgroup: it refills a slot right after consuming it.
            def refill(i, slot):
                @pl.when(i + num_stages < n)
                def _():
                    issue(i + num_stages, slot)
            load_table()
            fill_ring()
            if not fp8:
                attend(ring_k, nothing, ring_v, refill)
                return

            # fp8: dequantize K before its wgmma, V during it. (The one
            # staging tile is indexed by a traced 0: jax 0.11's lowering
            # rejects a literal index on a ref that a wgmma reads in a loop.)
            def staged(i):
                return lax.rem(i, staging[0])

            def staged_k(i):
                k_ref, slot = ring_k(i)
                dequant(0, i, k_ref, buffers.kb.at[staged(i)])
                return buffers.kb.at[staged(i)], slot

            def staged_v_during_qk(i, slot):
                dequant(1, i, ring_v(i, slot), buffers.vb.at[staged(i)])

            attend(staged_k, staged_v_during_qk,
                   lambda i, slot: buffers.vb.at[staged(i)], refill)
            return

        # Two warpgroups: wg 1 only issues copies (a slot once wg 0 frees
        # it) and, for fp8 pages, dequantizes; wg 0 only computes.
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            if not interpret:
                plgpu.set_max_registers(registers[0], action="increase")

            if not fp8:
                def release_slot(i, slot):
                    # Only slots the producer refills: an arrival nobody
                    # waits for would leave the barrier a phase ahead at
                    # exit.
                    @pl.when(i + num_stages < n)
                    def _():
                        plgpu.barrier_arrive(free_bar.at[slot])
                attend(ring_k, nothing, ring_v, release_slot)
                return

            def staged_k(i):
                sb = lax.rem(i, staging[0])
                plgpu.barrier_wait(barriers.kb_ready.at[sb])
                return buffers.kb.at[sb], sb

            def staged_v(i, _):
                sb = lax.rem(i, staging[1])
                plgpu.barrier_wait(barriers.vb_ready.at[sb])
                return buffers.vb.at[sb]

            def release(free, depth):
                def arrive(i, slot):
                    # Only tiles the producer refills (its wait for step
                    # i + depth).
                    @pl.when(i + depth < n)
                    def _():
                        plgpu.barrier_arrive(free.at[lax.rem(i, depth)])
                return arrive
            # K's tile is free once QK^T is done, V's once PV is.
            attend(staged_k, nothing, staged_v,
                   release(barriers.vb_free, staging[1]),
                   after_qk=release(barriers.kb_free, staging[0]))

        if not fp8:
            @pl.when(wg == 1)
            def _():
                if not interpret:
                    plgpu.set_max_registers(_PRODUCER_REGS,
                                            action="decrease")
                load_table()
                fill_ring()

                @pl.loop(0, jnp.maximum(n - num_stages, 0))
                def _(i):
                    slot = lax.rem(i, num_stages)
                    plgpu.barrier_wait(free_bar.at[slot])
                    issue(i + num_stages, slot)
            return

        # fp8: each producer warpgroup copies and dequantizes its kinds of
        # tiles (one: K and V; two: K in wg 1, V in wg 2; four: K's 64-token
        # halves of each step in wg 1 and 2, V's in wg 3 and 4), refilling
        # its part of a ring slot once those bytes are converted.
        def produce(kinds, chunks=None):
            if not interpret:
                plgpu.set_max_registers(registers[1], action="decrease")
            fill_ring(kinds, chunks)
            staged = ((buffers.kb, barriers.kb_ready, barriers.kb_free, k_bar,
                       k_smem),
                      (buffers.vb, barriers.vb_ready, barriers.vb_free, v_bar,
                       v_smem))

            @pl.loop(0, n)
            def _(i):
                slot = lax.rem(i, num_stages)
                for kind in kinds:
                    tiles, ready, free, landed, ring = staged[kind]
                    sb = lax.rem(i, staging[kind])

                    @pl.when(i >= staging[kind])
                    def _():
                        plgpu.barrier_wait(free.at[sb])
                    plgpu.barrier_wait(landed.at[slot])
                    dequant(kind, i, ring.at[slot], tiles.at[sb], chunks)
                    plgpu.barrier_arrive(ready.at[sb])

                # This producer's fp8 bytes of the slot are read (dequant's
                # commit fenced them): refill them. (A slot's barrier
                # completes only with every producer's copies, so one
                # running ahead cannot complete a phase alone.)
                @pl.when(i + num_stages < n)
                def _():
                    issue(i + num_stages, slot, kinds, chunks)

        @pl.when(wg == 1)
        def _():
            load_table()
            produce(*_producer_share(0, producers, bk))

        for w in range(2, producers + 1):
            pl.when(wg == w)(functools.partial(
                lambda share: produce(*share),
                _producer_share(w - 1, producers, bk)))

    pl.run_scoped(
        scoped,
        *_allocations(
            dtype, k_pages_ref.dtype, head_dim=head_dim, bk=bk,
            rows_out=rows_out, num_stages=num_stages, staging=staging,
            table_chunk=table_chunk, num_pieces=num_pieces,
            per_page=per_page, producer=producer, producers=producers,
            swap_ab=swap_ab, transforms=transforms,
            ring_transforms=ring_transforms),
        **({"collective_axes": "wg"} if producer else {}),
    )


def _program_range(kv_len, split, *, bk, num_splits, sliding_window,
                   pages_per_step, table_width, table_chunk):
    """This program's steps and table slice: (start, n, n_full, tbl_start,
    tbl_shift). It runs steps [start, start + n) of the sequence's
    bk-token blocks (the window's first block on; an empty split has n =
    0), the first n_full of them unmasked (every block but the last; none
    with a window). The table slice [tbl_start, + table_chunk) holds its
    pages from offset tbl_shift on (kept inside the table)."""
    num_blocks = lax.div(kv_len + (bk - 1), bk)
    lo = jnp.int32(0)
    if sliding_window is not None:
        lo = lax.div(jnp.maximum(kv_len - sliding_window, 0), bk)
    per_split = lax.div(num_blocks - lo + (num_splits - 1), num_splits)
    start = lo + split * per_split
    n = jnp.maximum(jnp.minimum(start + per_split, num_blocks) - start, 0)
    n_full = jnp.int32(0)
    if sliding_window is None:
        n_full = jnp.minimum(jnp.maximum(num_blocks - 1 - start, 0), n)
    tbl_start = jnp.minimum(start * pages_per_step, table_width - table_chunk)
    tbl_shift = start * pages_per_step - tbl_start
    return start, n, n_full, tbl_start, tbl_shift


def _allocations(dtype, page_dtype, *, head_dim, bk, rows_out, num_stages,
                 staging, table_chunk, num_pieces, per_page, producer,
                 producers, swap_ab, transforms, ring_transforms):
    """The program's shared memory and barriers: (_Buffers, _Barriers) of
    allocation descriptors for ``pl.run_scoped``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    fp8 = staging[0] > 0
    ring = (num_stages, bk, head_dim)
    copies = bk // _COPY_ROWS  # TMA copies that fill one ring slot
    optional_buffers, optional_barriers = {}, {}
    per_kind = max(1, producers // 2)  # producers converting each kind
    if fp8:
        optional_buffers = dict(
            kb=plgpu.SMEM((staging[0], bk, head_dim), dtype,
                          transforms=transforms),
            vb=plgpu.SMEM((staging[1], bk, head_dim), dtype,
                          transforms=transforms))
        if per_page:
            optional_buffers["scales"] = plgpu.SMEM((2, table_chunk), jnp.float32)
        if producer:
            optional_barriers = dict(
                kb_ready=plgpu.Barrier(num_arrivals=per_kind,
                                       num_barriers=staging[0]),
                vb_ready=plgpu.Barrier(num_arrivals=per_kind,
                                       num_barriers=staging[1]),
                kb_free=plgpu.Barrier(num_barriers=staging[0]),
                vb_free=plgpu.Barrier(num_barriers=staging[1]))
    q_rows, lse_rows = _ROWS, _ROWS
    if swap_ab:  # the query rows on N: R-wide tiles
        q_rows, lse_rows = rows_out, round_up(rows_out, 32)
        optional_buffers.update(
            out=plgpu.SMEM((head_dim, rows_out), dtype,
                           transforms=swizzled_smem_transforms(
                               dtype, rows_out * jnp.dtype(dtype).itemsize)),
            p=plgpu.SMEM((rows_out, bk), dtype, transforms=transforms))
    return (
        _Buffers(
            q=plgpu.SMEM((q_rows, head_dim), dtype, transforms=transforms),
            k=plgpu.SMEM(ring, page_dtype, transforms=ring_transforms),
            v=plgpu.SMEM(ring, page_dtype, transforms=ring_transforms),
            table=plgpu.SMEM((table_chunk,), jnp.int32),
            lse=plgpu.SMEM((lse_rows,), jnp.float32),
            **optional_buffers),
        _Barriers(
            q=plgpu.Barrier(num_barriers=1),
            table=plgpu.Barrier(num_arrivals=num_pieces * (3 if per_page
                                                           else 1),
                                num_barriers=1),
            k_ready=plgpu.Barrier(num_arrivals=copies, num_barriers=num_stages),
            v_ready=plgpu.Barrier(num_arrivals=copies, num_barriers=num_stages),
            free=plgpu.Barrier(num_barriers=num_stages),
            **optional_barriers))


def _producer_share(p: int, producers: int, bk: int
                    ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(kinds, 64-token chunks of each step or None for all) that producer
    warpgroup ``p`` of ``producers`` copies and dequantizes."""
    if producers == 1:
        return (0, 1), None
    if producers == 2:
        return (p,), None
    half = p % 2  # four: two per kind, alternate chunks
    return (p // 2,), tuple(range(half, bk // _ROWS, 2))


def _row_scales(scales, page_size, head_dim, dtype, interpret):
    """[64, H] ``dtype``: row r of a 64-token tile holds ``scales[r // B]``
    (one f32 scalar per page of the tile), in the tile's register layout."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if interpret:
        rows = jnp.concatenate([jnp.full((page_size,), x, jnp.float32)
                                for x in scales])
    else:
        # Each warp holds 16 rows of a WGMMA_8BIT tile: a page of 16.
        page = plgpu.broadcasted_iota(
            jnp.int32, (_ROWS,), 0,
            layout=plgpu.Layout.WGMMA_8BIT.reduce(1)) // page_size
        rows = jnp.full((_ROWS,), scales[-1], jnp.float32)
        for j in range(len(scales) - 2, -1, -1):
            rows = jnp.where(page == j, scales[j], rows)
    out = lax.broadcast_in_dim(rows.astype(dtype), (_ROWS, head_dim), [0])
    return out if interpret else plgpu.layout_cast(out,
                                                   plgpu.Layout.WGMMA_8BIT)


def decode_attention(
    q: jax.Array,  # [S, K, G, H] one decode row per sequence, grouped
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    kv_lens: jax.Array,  # [S] int32; 0 = no decode work for this row
    block_tables: jax.Array,  # [S, P] int32
    page_scales: jax.Array | None = None,  # [K, 2, num_pages] f32 (k, v)
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    tuning: MosaicDecodeTuning = MosaicDecodeTuning(),  # noqa: B008 - frozen
    interpret: bool = False,
) -> jax.Array:  # [S, K, G, H] f32, normalized
    """Decode attention of one query row per sequence (see module doc).
    ``page_scales``: per-page scales of fp8 pages (``kv_cache.py``'s
    ``[K, num_pages]`` pair, stacked), or None. Raises
    ``MosaicDecodeUnsupported`` for cases the kernel does not take."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    num_seqs, num_kv_heads, group, head_dim = q.shape
    _, num_pages, page_size, _ = k_pages.shape
    pages_per_seq = block_tables.shape[1]
    per_page = page_scales is not None
    why = supports(q.dtype, k_pages.dtype, head_dim, page_size, group,
                   tuning.tokens_per_step, per_page)
    if why:
        raise MosaicDecodeUnsupported(why)
    pages_per_step = tuning.tokens_per_step // page_size
    itemsize = jnp.dtype(q.dtype).itemsize
    staging = (0, 0)  # 16-bit pages go to wgmma as they land
    producers = 1  # copy-issuing (and, for fp8, dequantizing) warpgroups
    # Registers per thread: the consumer's, the producers'.
    registers = (tuning.consumer_registers or 232, _PRODUCER_REGS)
    # swap_ab: the query rows are wgmma's N, the group rounded up to a
    # width Mosaic swizzles.
    rows_out = (next(r for r in _SWAP_ROWS if r >= group) if tuning.swap_ab
                else round_up(group, 8))
    if jnp.dtype(k_pages.dtype) in _FP8_PAGES:
        num_stages, staging = tuning.fp8_stages(head_dim, itemsize, rows_out)
        producers = tuning.fp8_producers
        registers = tuning.registers(producers)
    else:
        num_stages = tuning.stages(head_dim, itemsize, rows_out)
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
    q_rows = jnp.pad(q, ((0, 0), (0, 0), (0, rows_out - group), (0, 0)))
    if staging[0] and tuning.fp8_f16:
        # Clamped to f16's range (in f32: bf16 rounds f16's max up to
        # 2**16): a larger |q| would turn every logit of its row into inf
        # (and the softmax into NaN) instead of saturating.
        f16_max = float(jnp.finfo(jnp.float16).max)
        q_rows = jnp.clip(q_rows.astype(jnp.float32), -f16_max,
                          f16_max).astype(jnp.float16)
    scale_rows: tuple[jax.Array, ...] = ()
    if page_scales is not None:  # each entry's (k, v) scales, table order
        scale_rows = (jnp.transpose(
            page_scales.astype(jnp.float32)[:, :, tables], (2, 0, 1, 3)),)

    kernel = functools.partial(
        _decode_kernel, sm_scale=sm_scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, pages_per_step=pages_per_step,
        num_stages=num_stages, num_splits=splits, table_chunk=chunk,
        producer=tuning.producer_warpgroup, staging=staging,
        per_page=per_page, interpret=interpret, producers=producers,
        probe=tuning.probe, overlap=tuning.overlap_softmax,
        swap_ab=tuning.swap_ab, registers=registers)
    part = (num_seqs, num_kv_heads, splits)
    kw = {}
    if interpret:
        kw["interpret"] = mosaic_interpret_params()
    else:
        kw["compiler_params"] = plgpu.CompilerParams(
            approx_math=True,
            unsafe_no_auto_barriers=tuning.no_auto_barriers)
    if tuning.producer_warpgroup:
        kw.update(num_threads=1 + producers, thread_name="wg")
    o, lse = plgpu.kernel(
        kernel,
        out_type=(jax.ShapeDtypeStruct(
            (*part, *((head_dim, rows_out) if tuning.swap_ab
                      else (rows_out, head_dim))), q_rows.dtype),
                  jax.ShapeDtypeStruct(
                      (*part, round_up(rows_out, 32) if tuning.swap_ab
                       else _ROWS), jnp.float32)),
        grid=(num_seqs, num_kv_heads, splits),
        grid_names=("seq", "kv_head", "split"),
        **kw,
    )(kv_lens.astype(jnp.int32), tables, *scale_rows, q_rows, k_pages,
      v_pages)
    if tuning.swap_ab:
        o = jnp.swapaxes(o, -1, -2)
    o = o[:, :, :, :group].astype(jnp.float32)
    if splits == 1:
        return o[:, :, 0]
    lse = lse[..., :group]  # [S, K, J, G]
    w = jnp.exp2(lse - lse.max(axis=2, keepdims=True))
    return (w[..., None] * o).sum(axis=2) / w.sum(axis=2)[..., None]
