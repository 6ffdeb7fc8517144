"""The physical layout of the KV page pool, defined in exactly one place.

One layer's cache is a pair of arrays ``(k_pages, v_pages)``, each

        [K, num_pages, B, H]      (kv heads, pages, page size, head dim)

Why this layout: a decode kernel reads one (kv head, page) tile per step of its
loop; with heads outermost that tile is ``B * H`` contiguous elements (4 KiB for
B=16, H=128, bf16), which is one wide, coalesced read that serves every query
head of the GQA group. Heads outermost also makes tensor parallelism a split of
the leading axis. This is the layout of JAX's bundled Pallas ``paged_attention``,
so the benchmark compares kernels on identical inputs.

Page 0 is the null page: padding tokens write there and padded block-table
entries point there; nothing ever reads it as real data.

A "slot" is ``page_id * B + offset_in_page``; the scheduler's block tables and
the runner's ``slot_mapping`` speak in slots.

Scales of quantized (fp8) pages, when they are per page rather than one per
tensor, are ``[K, num_pages]`` float32 arrays beside the pair: entry
``[h, p]`` multiplies kv head ``h``'s K (or V) in page ``p``. The attention
kernels read them through the same block table as the pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

NULL_PAGE = 0


def kv_pages_shape(num_pages: int, block_size: int, num_kv_heads: int,
                   head_dim: int) -> tuple[int, int, int, int]:
    """Shape of one layer's K (or V) page array."""
    return (num_kv_heads, num_pages, block_size, head_dim)


def init_kv_pages(num_layers: int, num_pages: int, block_size: int,
                  num_kv_heads: int, head_dim: int, dtype: jax.typing.DTypeLike
                  ) -> list[tuple[jax.Array, jax.Array]]:
    """A zeroed page pool: a list of L (k_pages, v_pages) pairs."""
    shape = kv_pages_shape(num_pages, block_size, num_kv_heads, head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
            for _ in range(num_layers)]


def _with_a_null_row(
    k: jax.Array,  # [1, K, H]
    v: jax.Array,  # [1, K, H]
    slot_mapping: jax.Array,  # [1]
    block_size: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # [2, K, H], [2, K, H], [2]
    """A one-token write plus a zero row aimed at the null page. With one
    index XLA CPU turns the scatter into a dynamic-update-slice, and copy
    insertion then copies the whole donated pool around it several times
    per layer, which makes a step many times slower (a plain
    dynamic_update_slice does the same). Two indices keep it a scatter,
    done in place; nothing reads the null page (nor its scale)."""
    k, v = (jnp.concatenate([a, jnp.zeros_like(a)]) for a in (k, v))
    slots = jnp.concatenate(
        [slot_mapping, jnp.full_like(slot_mapping, NULL_PAGE * block_size)])
    return k, v, slots


def _lone_token_on_cpu(write: Callable[..., Any], k: jax.Array, v: jax.Array,
                       slot_mapping: jax.Array, block_size: int,
                       **kw: Any) -> Any:
    """``write(k, v, slot_mapping, **kw)``, with a one-token write padded by
    `_with_a_null_row` when the program is lowered for the CPU only. On the
    GPU the padded two-row scatter is the slow one (about twice the time
    of a whole one-sequence decode step), while XLA GPU updates the
    one-index slice in place."""
    if k.shape[0] != 1:
        return write(k, v, slot_mapping, **kw)
    return jax.lax.platform_dependent(
        k, v, slot_mapping,
        cpu=lambda k, v, slots: write(
            *_with_a_null_row(k, v, slots, block_size), padded=True, **kw),
        default=lambda k, v, slots: write(k, v, slots, **kw))


def write_kv(
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    k: jax.Array,  # [T, K, H] new keys of this step
    v: jax.Array,  # [T, K, H] new values of this step
    slot_mapping: jax.Array,  # [T] int32 slot of each token; padding -> page 0
) -> tuple[jax.Array, jax.Array]:
    """Scatters this step's K/V into their slots (one fused XLA scatter, done
    in place when the pool is donated)."""
    num_kv_heads, num_pages, block_size, head_dim = k_pages.shape
    flat = (num_kv_heads, num_pages * block_size, head_dim)

    def scatter(k, v, slot_mapping, padded=False):
        k_flat = k_pages.reshape(flat).at[:, slot_mapping].set(
            jnp.swapaxes(k, 0, 1).astype(k_pages.dtype), mode="drop")
        v_flat = v_pages.reshape(flat).at[:, slot_mapping].set(
            jnp.swapaxes(v, 0, 1).astype(v_pages.dtype), mode="drop")
        return k_flat.reshape(k_pages.shape), v_flat.reshape(v_pages.shape)
    return _lone_token_on_cpu(scatter, k, v, slot_mapping, block_size)


def gather_kv(
    pages: jax.Array,  # [K, num_pages, B, H]
    block_table: jax.Array,  # [..., P] page ids
) -> jax.Array:
    """The K (or V) of whole sequences, in token order: [..., P * B, K, H]."""
    num_kv_heads, _, block_size, head_dim = pages.shape
    g = pages[:, block_table]  # [K, ..., P, B, H]
    g = jnp.moveaxis(g, 0, -2)  # [..., P, B, K, H]
    lead = block_table.shape[:-1]
    return g.reshape(*lead, block_table.shape[-1] * block_size, num_kv_heads,
                     head_dim)


def page_scales_shape(num_pages: int, num_kv_heads: int) -> tuple[int, int]:
    """Shape of one layer's per-page K (or V) scales."""
    return (num_kv_heads, num_pages)


def gather_page_scales(
    scales: jax.Array,  # [K, num_pages] f32
    block_table: jax.Array,  # [..., P] page ids
    block_size: int,
) -> jax.Array:
    """Per-page scales spread over tokens in gather_kv's order: [..., P * B,
    K, 1], to multiply gather_kv's result."""
    g = jnp.moveaxis(scales[:, block_table], 0, -1)  # [..., P, K]
    g = jnp.repeat(g, block_size, axis=-2)  # [..., P * B, K]
    return g[..., None]


def init_page_scales(num_layers: int, num_pages: int, num_kv_heads: int
                     ) -> list:
    """Zeroed per-page scales: per layer (k_scales, v_scales), each
    [K, num_pages] f32 (a zero scale marks a page nothing was written to)."""
    shape = page_scales_shape(num_pages, num_kv_heads)
    return [(jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))
            for _ in range(num_layers)]


def write_kv_scaled(
    k_pages: jax.Array,  # [K, num_pages, B, H] fp8
    v_pages: jax.Array,  # [K, num_pages, B, H] fp8
    k_scales: jax.Array,  # [K, num_pages] f32
    v_scales: jax.Array,  # [K, num_pages] f32
    k: jax.Array,  # [T, K, H] new keys of this step
    v: jax.Array,  # [T, K, H] new values of this step
    slot_mapping: jax.Array,  # [T] int32 slot of each token; padding -> page 0
    max_pages: int,  # static bound on the distinct pages the step writes
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Writes this step's K/V into quantized (fp8) pages with one scale per
    (kv head, page), ``amax / dtype max`` over the page's tokens.

    A page's scale can only grow: when new tokens raise it, the page's
    earlier tokens are requantized by ``old / new`` (exact when the scale
    stays, one more rounding when it grows). A step that writes offset 0 of
    a page starts it afresh (tokens fill pages in order, so whatever the
    page held belonged to an earlier owner). Only the pages this step
    touches are read and written: ``max_pages`` of them at most
    (``pages_touched_bound``).
    """
    num_kv_heads, num_pages, block_size, head_dim = k_pages.shape

    def write(k, v, slot_mapping, padded=False):
        # The null page a padded lone write adds is a second page.
        return _write_scaled(k_pages, v_pages, k_scales, v_scales, k, v,
                             slot_mapping, max(max_pages, 2) if padded else max_pages)
    return _lone_token_on_cpu(write, k, v, slot_mapping, block_size)


def _write_scaled(
    k_pages: jax.Array,  # [K, num_pages, B, H] fp8
    v_pages: jax.Array,  # [K, num_pages, B, H] fp8
    k_scales: jax.Array,  # [K, num_pages] f32
    v_scales: jax.Array,  # [K, num_pages] f32
    k: jax.Array,  # [T, K, H]
    v: jax.Array,  # [T, K, H]
    slot_mapping: jax.Array,  # [T] int32
    max_pages: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    num_kv_heads, num_pages, block_size, head_dim = k_pages.shape
    qmax = float(jnp.finfo(k_pages.dtype).max)
    page = slot_mapping // block_size  # [T]
    offset = slot_mapping % block_size
    # Tokens of one page are contiguous in a step (a sequence's tokens are
    # in order, and no two sequences write one page): number the pages.
    first = jnp.concatenate([jnp.ones((1,), bool), page[1:] != page[:-1]])
    cidx = jnp.cumsum(first) - 1  # [T] compact page index of each token
    cidx = jnp.minimum(cidx, max_pages - 1)
    upage = jnp.zeros((max_pages,), page.dtype).at[cidx].set(page)
    fresh = jnp.zeros((max_pages,), bool).at[cidx].max(offset == 0)

    def one(pages, scales, new):  # new [T, K, H]
        new = jnp.swapaxes(new, 0, 1).astype(jnp.float32)  # [K, T, H]
        amax = jnp.zeros((num_kv_heads, max_pages), jnp.float32).at[
            :, cidx].max(jnp.max(jnp.abs(new), axis=-1))
        old = jnp.where(fresh[None], 0.0, scales[:, upage])  # [K, U]
        # A page of zeros keeps scale 0 (its codes are 0 whatever divides).
        # (A multiply by the f32 reciprocal, written out: XLA may rewrite a
        # division by a constant into one, and then the result would
        # depend on whether it did.)
        scale = jnp.maximum(old, amax * jnp.float32(1.0 / qmax))
        div = jnp.where(scale > 0, scale, 1.0)
        # Earlier tokens rescaled by old / new; a fresh page's old bytes
        # are dropped.
        held = pages[:, upage].astype(jnp.float32) * (old / div)[..., None,
                                                                 None]
        held = held.at[:, cidx, offset].set(new / div[:, cidx][..., None])
        held = jnp.clip(held, -qmax, qmax).astype(pages.dtype)
        return pages.at[:, upage].set(held), scales.at[:, upage].set(scale)

    k_pages, k_scales = one(k_pages, k_scales, k)
    v_pages, v_scales = one(v_pages, v_scales, v)
    return k_pages, v_pages, k_scales, v_scales


def pages_touched_bound(num_tokens: int, num_seqs: int, block_size: int) -> int:
    """The most distinct pages a step of ``num_tokens`` tokens over
    ``num_seqs`` sequences writes: a sequence's q tokens span at most
    ``(q - 1) // B + 2`` pages, and padding tokens all go to page 0."""
    return max(1, min(num_tokens,
                      num_tokens // block_size + 2 * num_seqs + 1))
