"""The largest entries of each row of [S, V] logits without sorting the row.

Sorting whole 128k-entry rows would dominate the sampler's time on a GPU.
Top-k, top-p and the top-K logprobs only need the head of each row, so:

1. split each row into blocks of ``block_size`` consecutive entries and take
   every block's maximum (one streaming pass);
2. keep the ``kept_blocks`` blocks with the largest maxima (a top-k over
   V / block_size numbers) and call ``floor`` the smallest kept maximum;
3. gather the kept blocks (``kept_blocks * block_size`` candidates) and sort
   only those.

On CPU the candidates are instead XLA's TopK of ``kept_blocks`` entries per
row: its partial sort there costs about 2 ms for 16 rows of a 49k
vocabulary, where sorting the kept blocks' 8192 entries costs about 27 ms
(``benchmarks/sampler_cpu.py``). Either way top-k is exact up to
k = ``kept_blocks`` and the candidates hold every entry above ``floor``.

Why it is exact: an entry larger than ``floor`` sits in a block whose maximum
is larger than ``floor``, and every such block is kept. So the candidates
hold every entry above ``floor``, and at least ``kept_blocks`` entries at or
above it (each kept block's maximum). Entries equal to ``floor`` may also sit
in blocks that were not kept (ties); callers that need the complete set at or
above ``floor`` count it over the row (`count_at_least`). When fewer than
``kept_blocks`` blocks hold a finite entry, ``floor`` is -inf and every finite
entry is a candidate.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

# 128 blocks of 64 keep top-k exact up to k = 128 and make the sort 16x
# shorter than a 128k-entry row (the fastest of the sizes benchmarks/
# sampler_breakdown.py times).
KEPT_BLOCKS = 128
BLOCK_SIZE = 64


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["values", "ids", "floor"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Candidates:
    values: jax.Array  # [S, M] descending (M = kept blocks * block size)
    ids: jax.Array  # [S, M] int32 ids of `values`; >= V for the -inf pad
    floor: jax.Array  # [S] smallest kept block maximum; -inf = all finite kept


def top_candidates(x: jax.Array, kept_blocks: int = KEPT_BLOCKS,
                   block_size: int = BLOCK_SIZE, *,
                   by_top_k: bool | None = None) -> Candidates:
    """x [S, V] float -> the kept blocks' entries, sorted descending; with
    ``by_top_k`` (default: on CPU) the ``kept_blocks`` largest entries."""
    if by_top_k is None:
        by_top_k = jax.default_backend() == "cpu"
    if by_top_k:
        return _top_k_candidates(x, kept_blocks)
    s, v = x.shape
    num_blocks = -(-v // block_size)
    pad = num_blocks * block_size - v
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    blocks = x.reshape(s, num_blocks, block_size)
    kept = min(kept_blocks, num_blocks)
    block_max, block_ids = jax.lax.top_k(jnp.max(blocks, axis=-1), kept)
    floor = block_max[:, -1] if kept < num_blocks else jnp.full(
        (s,), -jnp.inf, x.dtype)  # every block kept: nothing is missing
    values = jnp.take_along_axis(blocks, block_ids[:, :, None], axis=1)
    ids = (block_ids[:, :, None] * block_size
           + jnp.arange(block_size, dtype=jnp.int32)).astype(jnp.int32)
    neg_values, ids = jax.lax.sort(
        (-values.reshape(s, -1), ids.reshape(s, -1)), dimension=1, num_keys=1)
    return Candidates(-neg_values, ids, floor)


def _top_k_candidates(x: jax.Array, kept: int) -> Candidates:
    """The ``kept`` largest entries of each row. floor is the last of them,
    or -inf when every entry is kept or the row has fewer finite ones (then
    every finite entry is a candidate); entries equal to floor may be left
    out (ties), as the blocks leave them."""
    s, v = x.shape
    values, ids = jax.lax.top_k(x, min(kept, v))
    # Keeps the ids alive (a select that changes nothing: TopK's ids are
    # never negative): with them unused, as the sampler reads only values,
    # XLA:CPU rewrites TopK into a sort of the whole row, about 30 times
    # slower. An optimization barrier would do the same on one device but
    # aborts XLA's TopK decomposer in a program over several devices.
    values = jnp.where(ids >= 0, values, -jnp.inf)
    floor = values[:, -1] if kept < v else jnp.full((s,), -jnp.inf, x.dtype)
    return Candidates(values, ids, floor)  # lax.top_k's ids are int32


def count_at_least(x: jax.Array, floor: jax.Array) -> jax.Array:
    """[S] finite entries of each row of x (a row of logits, or of its
    candidates) that are >= floor."""
    return jnp.sum((x >= floor[:, None]) & (x > -jnp.inf), axis=-1,
                   dtype=jnp.int32)


def top_k_values_and_ids(x: jax.Array, k: int, *, by_top_k: bool | None = None
                         ) -> tuple[jax.Array, jax.Array]:
    """Like ``jax.lax.top_k(x, k)`` for rows with at least k finite entries:
    same values; among equal values the ids may differ."""
    kept = max(k, 1)
    c = top_candidates(x, kept_blocks=kept, block_size=BLOCK_SIZE,
                       by_top_k=by_top_k)
    return c.values[:, :k], c.ids[:, :k]
