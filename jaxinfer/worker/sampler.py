"""Token sampling inside the jitted step, vectorized over the batch.

Per-request parameters arrive as arrays; each request draws from its own PRNG
stream (its seed folded with its output position), so a seeded request samples
the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["temperature", "top_k", "top_p", "seeds",
                                "positions"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SamplingMetadata:
    temperature: jax.Array  # [S] float32; 0 = greedy
    top_k: jax.Array  # [S] int32; <= 0 = off
    top_p: jax.Array  # [S] float32; 1 = off
    seeds: jax.Array  # [S] uint32 per-request stream seed
    positions: jax.Array  # [S] int32 output index of the token being drawn


def sample(logits: jax.Array, md: SamplingMetadata) -> jax.Array:
    """logits [S, V] float32 -> token ids [S] int32."""
    greedy_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    vocab = logits.shape[-1]
    temp = jnp.where(md.temperature > 0, md.temperature, 1.0)
    scaled = logits / temp[:, None]
    # top-k and top-p on the sorted logits; one sort serves both.
    sorted_logits = jnp.sort(scaled, axis=-1)[:, ::-1]
    k = jnp.where(md.top_k > 0, jnp.minimum(md.top_k, vocab), vocab)
    kth = jnp.take_along_axis(sorted_logits, (k - 1)[:, None], axis=-1)
    probs_sorted = jax.nn.softmax(sorted_logits, axis=-1)
    cum = jnp.cumsum(probs_sorted, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (always >= 1 token).
    keep_sorted = (cum - probs_sorted) < md.top_p[:, None]
    cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1,
                     keepdims=True)
    threshold = jnp.maximum(kth, cutoff)
    masked = jnp.where(scaled >= threshold, scaled, -jnp.inf)

    def draw(seed, pos, row):
        key = jax.random.fold_in(jax.random.key(seed), pos)
        return jax.random.categorical(key, row)

    sampled = jax.vmap(draw)(md.seeds, md.positions, masked).astype(jnp.int32)
    return jnp.where(md.temperature > 0, sampled, greedy_tokens)
