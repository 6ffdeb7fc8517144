"""The step program of a pooling engine: the forward pass over the step's
tokens (K/V written to pages as for generation, so chunked prefill works),
reduced per sequence on the device to what the host pools from.

Each row gets three [D] float32 vectors: the sum of its chunk's final-norm
hidden states (mean pooling adds the chunks' sums), its chunk's first
token's state (CLS: the chunk at position 0) and its chunk's last token's
state (last-token pooling: the prompt's final chunk). Returning all three
keeps one program per bucket whatever the pooling type; [S, 3, D] is small
next to the hidden states of the whole step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxinfer.models.runtime import FINAL_NORM, run_model_tapped

from ..worker.packing import unpack_step
from .rows import PooledRows


def pooled_forward(model, bucket, params, kv_pages, constants, packed,
                   last_indices):
    """-> ([S, 3, D] float32 per-row (sum, first, last), kv_pages).
    ``last_indices`` [S]: each row's last token (padding rows: 0)."""
    input_ids, positions, md = unpack_step(packed, bucket)
    # The final norm's output of every token (the head's logits of the S
    # rows are computed and dropped: S rows are small next to T).
    _, hidden, kv_pages = run_model_tapped(
        model, params, constants, kv_pages, input_ids, positions, md,
        last_indices, (FINAL_NORM,))
    hidden = hidden.astype(jnp.float32)  # [T, D]
    T = hidden.shape[0]
    S = md.cu_q_lens.shape[0] - 1
    # Token t belongs to the row whose range [cu[s], cu[s+1]) holds it;
    # padding tokens (t >= cu[S]) get S and drop out of the sums.
    row = jnp.searchsorted(md.cu_q_lens[1:], jnp.arange(T, dtype=jnp.int32),
                           side="right")
    sums = jax.ops.segment_sum(hidden, row, num_segments=S)
    first = jnp.take(hidden, jnp.minimum(md.cu_q_lens[:-1], T - 1), axis=0)
    last = jnp.take(hidden, last_indices, axis=0)
    return jnp.stack([sums, first, last], axis=1), kv_pages


class PooledSteps:
    """A pooling runner's program (one per bucket, built by jit on first
    use) and the partial pools between a prompt's chunks."""

    def __init__(self, model, pooling_type: str):
        self._program = jax.jit(functools.partial(pooled_forward, model),
                                static_argnums=(0,), donate_argnums=(2,))
        self.rows = PooledRows(pooling_type)

    def run(self, bucket, params, kv_pages, constants, packed, last_indices):
        """Enqueues one step; -> ([S, 3, D] on the device, kv_pages)."""
        return self._program(bucket, params, kv_pages, constants, packed,
                             last_indices)
