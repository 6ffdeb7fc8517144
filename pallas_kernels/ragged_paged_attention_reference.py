"""Pure-jnp ragged paged attention: the reference every kernel is tested
against, and the engine's default path on CPU.

A step's batch is ragged: sequence ``s`` owns query tokens
``cu_q_lens[s]:cu_q_lens[s+1]`` (1 for a decode, a chunk for a prefill) and has
``kv_lens[s]`` tokens in its pages, this step's included (they are written
before attention runs). Query token ``i`` of a sequence with ``q_len`` new
tokens sits at position ``kv_len - q_len + i`` and attends causally to the
positions at or before it (and, with a sliding window ``w``, to the last ``w``).
Tokens past ``cu_q_lens[num_seqs]`` are padding and get zeros.

The reference gathers each token's sequence K/V through its block table, in
blocks of tokens so that memory stays bounded; it is written for clarity and
exactness, not speed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .kv_cache import gather_kv, gather_page_scales

# Tokens handled per block of the reference; bounds the gathered K/V to
# TOKEN_BLOCK * P * B * K * H elements.
TOKEN_BLOCK = 64
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def token_positions_and_seqs(cu_q_lens, kv_lens, num_seqs, num_tokens):
    """For each of the T token rows: its sequence id, its absolute position
    and whether it is a real (non-padding) token."""
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    seq_ids = jnp.searchsorted(cu_q_lens[1:], t, side="right").astype(jnp.int32)
    seq_ids = jnp.minimum(seq_ids, cu_q_lens.shape[0] - 2)
    valid = t < cu_q_lens[num_seqs]
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    pos = kv_lens[seq_ids] - q_lens[seq_ids] + (t - cu_q_lens[seq_ids])
    return seq_ids, pos, valid


def _per_token(scale, block_tables, block_size):
    scale = jnp.asarray(scale, jnp.float32)
    if scale.ndim == 2:
        return gather_page_scales(scale, block_tables, block_size)
    return scale.reshape(())


@functools.partial(
    jax.jit,
    static_argnames=("sm_scale", "sliding_window", "logit_soft_cap",
                     "decode_only"))
def ragged_paged_attention_reference(
    q: jax.Array,  # [T, N, H]
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    kv_lens: jax.Array,  # [S] int32 tokens in each sequence's pages
    block_tables: jax.Array,  # [S, P] int32 page ids
    cu_q_lens: jax.Array,  # [S + 1] int32 cumulative query lengths
    num_seqs: jax.Array,  # [] or [1] int32 real sequences (rest is padding)
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    k_scale: jax.Array | None = None,
    v_scale: jax.Array | None = None,
    decode_only: bool = False,
    max_q_len: int = 0,
) -> jax.Array:
    """``decode_only``: every real sequence has exactly one query token
    (token s belongs to sequence s), which lets each sequence attend to its
    own gathered K/V instead of every token gathering its sequence's.
    ``max_q_len``: the kernels' hint for short queries; any layout is
    served here as it is."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pages.shape[0]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_q_heads}) must be a multiple of "
                         f"kv heads ({num_kv_heads})")
    if k_pages.shape[-1] != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and pages "
                         f"({k_pages.shape[-1]}) differ")
    group = num_q_heads // num_kv_heads
    num_seqs = jnp.reshape(num_seqs, ())
    seq_ids, pos, valid = token_positions_and_seqs(cu_q_lens, kv_lens,
                                                   num_seqs, num_tokens)

    k_all = gather_kv(k_pages, block_tables).astype(jnp.float32)  # [S, L, K, H]
    v_all = gather_kv(v_pages, block_tables).astype(jnp.float32)
    # A scale is one per tensor (a scalar) or one per (kv head, page):
    # [K, num_pages] (kv_cache.py).
    block_size = k_pages.shape[2]
    if k_scale is not None:
        k_all = k_all * _per_token(k_scale, block_tables, block_size)
    if v_scale is not None:
        v_all = v_all * _per_token(v_scale, block_tables, block_size)
    max_len = k_all.shape[1]
    kv_pos = jnp.arange(max_len, dtype=jnp.int32)
    if decode_only:
        return _decode_attention(q, k_all, v_all, kv_lens, num_seqs, kv_pos,
                                 sm_scale, sliding_window, logit_soft_cap)

    pad = (-num_tokens) % TOKEN_BLOCK
    qf = jnp.pad(q.astype(jnp.float32), ((0, pad), (0, 0), (0, 0)))
    qf = qf.reshape(-1, TOKEN_BLOCK, num_kv_heads, group, head_dim)
    blk = lambda x: jnp.pad(x, (0, pad)).reshape(-1, TOKEN_BLOCK)

    def one_block(args):
        qb, sb, pb = args  # [TB, K, G, H], [TB], [TB]
        kb, vb = k_all[sb], v_all[sb]  # [TB, L, K, H]
        s = jnp.einsum("tkgh,tlkh->tkgl", qb, kb) * sm_scale
        if logit_soft_cap is not None:
            s = logit_soft_cap * jnp.tanh(s / logit_soft_cap)
        mask = kv_pos[None, :] <= pb[:, None]
        if sliding_window is not None:
            mask &= kv_pos[None, :] > pb[:, None] - sliding_window
        s = jnp.where(mask[:, None, None, :], s, _MASK_VALUE)
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("tkgl,tlkh->tkgh", p, vb)

    out = jax.lax.map(one_block, (qf, blk(seq_ids), blk(pos)))
    out = out.reshape(-1, num_q_heads, head_dim)[:num_tokens]
    out = jnp.where(valid[:, None, None], out, 0.0)
    return out.astype(q.dtype)


def _decode_attention(q, k_all, v_all, kv_lens, num_seqs, kv_pos, sm_scale,
                      sliding_window, logit_soft_cap):
    """One query token per sequence: q rows [:S] against k_all/v_all [S, L,
    K, H] directly (the general path gathers a copy of the sequence's K/V
    for every token, which dominated CPU decode steps)."""
    num_tokens, num_q_heads, head_dim = q.shape
    n = min(num_tokens, k_all.shape[0])
    num_kv_heads = k_all.shape[2]
    qs = q[:n].astype(jnp.float32).reshape(
        n, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    s = jnp.einsum("skgh,slkh->skgl", qs, k_all[:n]) * sm_scale
    if logit_soft_cap is not None:
        s = logit_soft_cap * jnp.tanh(s / logit_soft_cap)
    pos = kv_lens[:n] - 1  # each sequence's query sits at its last position
    mask = kv_pos[None, :] <= pos[:, None]
    if sliding_window is not None:
        mask &= kv_pos[None, :] > pos[:, None] - sliding_window
    s = jnp.where(mask[:, None, None, :], s, _MASK_VALUE)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("skgl,slkh->skgh", p, v_all[:n]).reshape(
        n, num_q_heads, head_dim)
    out = jnp.where((jnp.arange(n) < num_seqs)[:, None, None], out, 0.0)
    out = jnp.pad(out, ((0, num_tokens - n), (0, 0), (0, 0)))
    return out.astype(q.dtype)
