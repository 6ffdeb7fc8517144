"""Token sampling inside the jitted step, vectorized over the batch.

The order is vLLM V1's: logprobs from the raw logits; the token mask (a
structured-output grammar, the allowed-token whitelist, bad words and
min_tokens, folded into one packed mask on the host); logit bias;
repetition / frequency / presence penalties; greedy argmax; temperature,
min-p, top-k, top-p; a draw.

Every per-request parameter is an array row. A feature that no request of the
batch uses is None in `SamplingMetadata`: the pytree then has another
structure, jit compiles a variant without that work, and plain steps stay
cheap. Each request draws from its own PRNG stream (its seed folded with its
output position), so a seeded request samples the same tokens whatever else
shares its batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxinfer.models.attention import StepArray

from .logprob_ops import LogprobArrays, gather_logprobs
from .penalties import PenaltyParams, PenaltyState, apply_penalties, update_penalty_state
from .top_candidates import BLOCK_SIZE, KEPT_BLOCKS, count_at_least, top_candidates

_FIELDS = ["temperature", "seeds", "positions", "top_k", "top_p", "min_p",
           "bias_ids", "bias_values", "penalties",
           "token_bitmask"]


@functools.partial(jax.tree_util.register_dataclass, data_fields=_FIELDS,
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SamplingMetadata:
    # None = every row greedy (no draw at all).
    temperature: StepArray | None = None  # [S] float32; 0 = greedy row
    seeds: StepArray | None = None  # [S] uint32 per-request stream seed
    positions: StepArray | None = None  # [S] int32 output index being drawn
    top_k: StepArray | None = None  # [S] int32; <= 0 = off
    top_p: StepArray | None = None  # [S] float32; 1 = off
    min_p: StepArray | None = None  # [S] float32; 0 = off
    # Padded bias lists (sampler_widths.bias_widths); the pad id is V (out
    # of range, dropped).
    bias_ids: StepArray | None = None  # [S, Kb] int32
    bias_values: StepArray | None = None  # [S, Kb] float32
    penalties: PenaltyParams | None = None
    # [S, ceil(V / 32)] int32, bit t % 32 of word t // 32 set when token t
    # may be sampled (grammar, allowed ids, less banned ids); rows without
    # a limit all -1.
    token_bitmask: StepArray | None = None


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["token_ids", "logprobs"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    token_ids: jax.Array  # [S] int32
    logprobs: LogprobArrays | None  # rows [S], when asked for


def _scatter_rows(shape, ids, values, fill, mode_add: bool):
    """[S, V] array of ``fill`` with ``values`` put at (row, ids[row, j])."""
    s = ids.shape[0]
    rows = jnp.broadcast_to(jnp.arange(s)[:, None], ids.shape)
    base = jnp.full(shape, fill, dtype=jnp.asarray(values).dtype)
    at = base.at[rows, ids]
    return at.add(values, mode="drop") if mode_add else at.set(values, mode="drop")


def apply_token_bitmask(logits: jax.Array, words: StepArray) -> jax.Array:
    """logits [S, V] with the tokens each row's packed mask [S, W] leaves
    out at -inf (a row of all-ones words passes unchanged)."""
    vocab = logits.shape[-1]
    ids = jnp.arange(vocab, dtype=jnp.int32)
    word = jnp.take(words, ids // 32, axis=1)  # [S, V]
    allowed = ((word >> (ids % 32)) & 1) != 0
    return jnp.where(allowed, logits, -jnp.inf)


def process_logits(logits: jax.Array, md: SamplingMetadata,
                   state: PenaltyState | None) -> jax.Array:
    """Token mask, bias and penalties (the argmax-changing steps)."""
    logits = logits.astype(jnp.float32)
    shape = logits.shape
    if md.token_bitmask is not None:
        logits = apply_token_bitmask(logits, md.token_bitmask)
    if md.bias_ids is not None:
        logits = logits + _scatter_rows(shape, md.bias_ids, md.bias_values,
                                        0.0, True)
    if md.penalties is not None:
        if state is None:
            raise ValueError("SamplingMetadata.penalties without a PenaltyState")
        logits = apply_penalties(logits, state, md.penalties)
    return logits


def _temperatures(md: SamplingMetadata) -> StepArray:
    if md.temperature is None:
        raise ValueError("filtering logits of an all-greedy batch "
                         "(SamplingMetadata.temperature is None)")
    return md.temperature


def _temperature_and_min_p(logits: jax.Array, md: SamplingMetadata):
    temperature = _temperatures(md)
    temp = jnp.where(temperature > 0, temperature, 1.0)
    x = logits / temp[:, None]
    if md.min_p is not None:
        # p < min_p * p_max  <=>  x < x_max + log(min_p); min_p = 0 keeps all.
        floor = jnp.max(x, axis=-1, keepdims=True) + jnp.log(md.min_p)[:, None]
        x = jnp.where(x < floor, -jnp.inf, x)
    return x


def _filter_by_sorting_rows(x: jax.Array, md: SamplingMetadata) -> jax.Array:
    """Top-k then top-p on temperature-scaled, min-p-cut logits, by sorting
    whole rows: the general path, taken when the candidates cannot decide."""
    vocab = x.shape[-1]
    sorted_x = -jnp.sort(-x, axis=-1)  # descending; one sort serves both
    threshold = jnp.full((x.shape[0], 1), -jnp.inf, x.dtype)
    if md.top_k is not None:
        k = jnp.where(md.top_k > 0, jnp.minimum(md.top_k, vocab), vocab)
        threshold = jnp.take_along_axis(sorted_x, (k - 1)[:, None], axis=-1)
        # Ties with the k-th value are kept (vLLM masks only "< k-th").
        sorted_x = jnp.where(sorted_x < threshold, -jnp.inf, sorted_x)
    if md.top_p is not None:
        probs = jax.nn.softmax(sorted_x, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        # The smallest prefix whose mass reaches top_p (always >= 1 token).
        # top_p = 1 is off: without this, tokens whose mass rounds away
        # behind a sum of 1.0 would be cut.
        keep = (mass_before < md.top_p[:, None]) | (md.top_p[:, None] >= 1.0)
        cutoff = jnp.min(jnp.where(keep, sorted_x, jnp.inf), axis=-1,
                         keepdims=True)
        threshold = jnp.maximum(threshold, cutoff)
    return jnp.where(x >= threshold, x, -jnp.inf)


def _order_keys(x: jax.Array) -> jax.Array:
    """float32 -> uint32 keys in the floats' order (the radix-sort map:
    negatives have every bit flipped, non-negatives only the sign bit).
    -0.0 becomes +0.0 first: the floats compare equal, their bits do not."""
    x = jnp.where(x == 0, jnp.float32(0), x.astype(jnp.float32))
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    negative = (bits >> 31) == 1
    return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _smallest_key_where(fits, hi: jax.Array) -> jax.Array:
    """Per row the smallest uint32 key K with ``fits(K)`` true, for a
    ``fits`` that is monotone (false below some K, true from it on) and true
    at ``hi`` [S]: 32 halvings of [0, hi], no sort."""
    def halve(_, lo_hi):
        lo, hi = lo_hi
        mid = lo + (hi - lo) // 2
        ok = fits(mid)
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    lo = jnp.zeros_like(hi)
    return jax.lax.fori_loop(0, 32, halve, (lo, hi))[1]


def _filter_by_bisection(x: jax.Array, md: SamplingMetadata) -> jax.Array:
    """What `_filter_by_sorting_rows` keeps, found by bisecting on the
    threshold instead of sorting: 64 passes over each row, each a compare
    and a sum. On CPU XLA's sort of a batch of vocabulary-wide rows costs
    ten times these passes; GPUs keep the sort, which is faster there.

    Top-k keeps the entries >= the k-th largest: the smallest key K with
    fewer than k entries above it. Top-p keeps the entries >= the smallest
    value v whose mass strictly above it is < top_p (the first entry of a
    tie group in the descending sort sees exactly that mass before it), so
    both keep ties whole, as the sort does. Sums here run in another order
    than the sort's cumsum: a row whose mass lands within float rounding of
    top_p may keep one tie group more or less."""
    keys = _order_keys(x)
    row_max = jnp.max(keys, axis=-1)
    vocab = x.shape[-1]
    cut = jnp.zeros_like(row_max)  # keep everything
    if md.top_k is not None:
        k = jnp.where(md.top_k > 0, jnp.minimum(md.top_k, vocab), vocab)
        cut = _smallest_key_where(
            lambda key: jnp.sum(keys > key[:, None], axis=-1) < k, row_max)
    if md.top_p is not None:
        alive = keys >= cut[:, None]
        e = jnp.where(alive, jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)),
                      0.0)
        probs = e / jnp.sum(e, axis=-1, keepdims=True)
        p_cut = _smallest_key_where(
            lambda key: jnp.sum(jnp.where(keys > key[:, None], probs, 0.0),
                                axis=-1) < md.top_p, row_max)
        cut = jnp.where(md.top_p >= 1.0, cut, jnp.maximum(cut, p_cut))
    return jnp.where(keys >= cut[:, None], x, -jnp.inf)


def _filter_whole_rows(x: jax.Array, md: SamplingMetadata) -> jax.Array:
    """The general path, for batches the candidates cannot decide: a sort
    where sorting is fast (GPU), bisection on CPU."""
    if jax.default_backend() == "cpu":
        return _filter_by_bisection(x, md)
    return _filter_by_sorting_rows(x, md)


def _threshold_from_candidates(x, md, kept_blocks, block_size, by_top_k=None):
    """Per row the top-k/top-p threshold computed from the row's candidates
    (see top_candidates), and whether the candidates decided it exactly."""
    s, vocab = x.shape
    c = top_candidates(x, kept_blocks, block_size, by_top_k=by_top_k)
    floor = c.floor[:, None]
    in_head = count_at_least(c.values, c.floor)  # candidates >= floor, all exact
    neg_inf = jnp.full((s,), -jnp.inf, x.dtype)
    k = (jnp.zeros((s,), jnp.int32) if md.top_k is None
         else jnp.where(md.top_k >= vocab, 0, md.top_k))
    k_on = k > 0
    k_inside = k_on & (k <= in_head)
    kth = jnp.take_along_axis(c.values, jnp.clip(k - 1, 0)[:, None],
                              axis=-1)[:, 0]
    # k beyond the head is exact only when the head is every finite entry
    # (floor = -inf): then top-k keeps them all.
    threshold = jnp.where(k_inside, kth, neg_inf)
    exact = ~k_on | k_inside | (c.floor == -jnp.inf)
    # One pass over the row: does the head hold every entry >= floor (ties
    # of floor may sit in blocks that were not kept), and the softmax
    # normalizer of the top-k survivors.
    complete = count_at_least(x, c.floor) == in_head
    exact &= complete
    if md.top_p is not None:
        row_max = c.values[:, :1]
        z = jnp.sum(jnp.where(x >= threshold[:, None], jnp.exp(x - row_max),
                              0.0), axis=-1, keepdims=True)
        alive = (c.values >= threshold[:, None]) & (c.values > -jnp.inf)
        probs = jnp.where(alive, jnp.exp(c.values - row_max) / z, 0.0)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = alive & (mass_before < md.top_p[:, None])
        cutoff = jnp.min(jnp.where(keep, c.values, jnp.inf), axis=-1)
        head_mass = jnp.sum(jnp.where(c.values >= floor, probs, 0.0), axis=-1)
        # The cut lies in the exact head if the head's mass reaches top_p,
        # or if every survivor is in the head.
        p_on = md.top_p < 1.0
        exact &= ~p_on | (head_mass >= md.top_p) | (threshold >= c.floor)
        threshold = jnp.where(p_on, jnp.maximum(threshold, cutoff), threshold)
    return threshold, exact


def filter_logits(logits: jax.Array, md: SamplingMetadata, *,
                  kept_blocks: int = KEPT_BLOCKS,
                  block_size: int = BLOCK_SIZE,
                  by_top_k: bool | None = None) -> jax.Array:
    """Temperature, min-p, top-k, top-p: the logits the draw uses, with
    filtered-out tokens at -inf. Top-p acts on the distribution already cut
    by min-p and top-k (renormalized), as in vLLM.

    Top-k/top-p thresholds come from each row's candidates (its
    ``kept_blocks`` best blocks, or on CPU or with ``by_top_k`` its
    ``kept_blocks`` largest entries: see top_candidates) whenever they
    decide them exactly: top-k up to the head's size, top-p when the cut
    falls in the head. Otherwise (a larger top_k, a flat distribution whose nucleus
    reaches past the head) the whole batch takes the full-row sort instead,
    so results never depend on the shortcut."""
    x = _temperature_and_min_p(logits, md)
    if md.top_k is None and md.top_p is None:
        return x
    threshold, exact = _threshold_from_candidates(x, md, kept_blocks,
                                                  block_size, by_top_k)
    undecided = jnp.any(~exact & (_temperatures(md) > 0))
    return jax.lax.cond(
        undecided, lambda: _filter_whole_rows(x, md),
        lambda: jnp.where(x >= threshold[:, None], x, -jnp.inf))


def _draw(seeds, positions, x):
    def one(seed, pos, row):
        key = jax.random.fold_in(jax.random.key(seed), pos)
        return jax.random.categorical(key, row)

    return jax.vmap(one)(seeds, positions, x).astype(jnp.int32)


def sample(logits: jax.Array, md: SamplingMetadata,
           state: PenaltyState | None = None,
           num_logprobs: int | None = None) -> SamplerOutput:
    """logits [S, V] float32 -> SamplerOutput. ``num_logprobs`` (static):
    None = no logprobs; K = the sampled token's plus the top K."""
    raw = logits
    logits = process_logits(logits, md, state)
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if md.temperature is not None:
        drawn = _draw(md.seeds, md.positions, filter_logits(logits, md))
        tokens = jnp.where(md.temperature > 0, drawn, tokens)
    lp = None if num_logprobs is None else gather_logprobs(raw, tokens,
                                                           num_logprobs)
    return SamplerOutput(tokens, lp)


__all__ = ["SamplingMetadata", "SamplerOutput", "PenaltyParams",
           "apply_token_bitmask",
           "PenaltyState", "sample", "process_logits", "filter_logits",
           "update_penalty_state"]
