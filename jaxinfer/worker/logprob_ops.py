"""Logprobs on device: the chosen token's logprob and rank plus the top-K.

Computed from the raw logits (vLLM's default ``raw_logprobs`` mode). K is
static (the engine's ``max_logprobs``); each request keeps the first k of it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from .top_candidates import top_k_values_and_ids


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["token_ids", "logprobs", "ranks"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LogprobArrays:
    token_ids: jax.Array  # [R, 1 + K] int32; column 0 = the chosen token
    logprobs: jax.Array  # [R, 1 + K] float32
    ranks: jax.Array  # [R, 1 + K] int32; 1-based


# XLA:GPU's fast top-k path takes k <= 16; a larger k falls back to sorting
# whole rows, several times slower on a 128k vocabulary.
_FAST_TOP_K = 16


def top_k_in_rounds(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k(x, k)`` as rounds of k <= 16: each round takes the
    next 16 and masks them out. Same values and indices (ties in index
    order), since every round's values are <= the previous round's. Rows
    must have at least k finite entries (raw logprobs always do)."""
    if k <= _FAST_TOP_K:
        return jax.lax.top_k(x, k)
    rows = jnp.arange(x.shape[0])[:, None]
    values, indices = [], []
    for _ in range(-(-k // _FAST_TOP_K)):
        v, i = jax.lax.top_k(x, _FAST_TOP_K)
        values.append(v)
        indices.append(i)
        x = x.at[rows, i].set(-jnp.inf)
    return (jnp.concatenate(values, axis=1)[:, :k],
            jnp.concatenate(indices, axis=1)[:, :k])


def gather_logprobs(logits: jax.Array, chosen: jax.Array,
                    num_logprobs: int) -> LogprobArrays:
    """logits [R, V] raw, chosen [R] int32 -> the chosen token's logprob and
    rank, followed by the top ``num_logprobs`` tokens."""
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = chosen.astype(jnp.int32)
    chosen_lp = jnp.take_along_axis(logprobs, chosen[:, None], axis=-1)  # [R, 1]
    # vLLM's rank: how many tokens are at least as likely as the chosen one.
    chosen_rank = jnp.sum(logprobs >= chosen_lp, axis=-1,
                          dtype=jnp.int32)[:, None]
    ids, lps, ranks = [chosen[:, None]], [chosen_lp], [chosen_rank]
    if num_logprobs > 0:
        top_lp, top_ids = top_k_values_and_ids(logprobs, num_logprobs)
        rows = logits.shape[0]
        ids.append(top_ids.astype(jnp.int32))
        lps.append(top_lp)
        ranks.append(jnp.broadcast_to(
            jnp.arange(1, num_logprobs + 1, dtype=jnp.int32),
            (rows, num_logprobs)))
    return LogprobArrays(jnp.concatenate(ids, axis=1),
                         jnp.concatenate(lps, axis=1),
                         jnp.concatenate(ranks, axis=1))
