"""Repetition / frequency / presence penalties from token counts on device.

Design: the runner owns a `PenaltyState`, two [R, V] buffers (R = max_num_seqs
+ 1) that live on the device between steps and are donated into the step:
``output_counts[slot, v]`` = how often request ``slot`` generated token v, and
``prompt_mask[slot, v]`` = v occurs in its prompt. A request that uses
penalties holds one slot (row) while it runs; the last row is a scratch row
that padding writes into.

Each step the host lists the tokens to count (`count_ids`, `count_slots`,
`count_is_output`): normally just the step's input tokens of penalized
requests (a decode step feeds the previously sampled token, so the counts are
complete when this step samples), plus, when a request gets a fresh slot,
every earlier token (prompt pages from the prefix cache or a fork, tokens
recomputed after preemption). `reset_slots` zeroes fresh slots first. Nothing
per vocabulary entry crosses the host; the host sends O(new tokens) ids.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["output_counts", "prompt_mask"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PenaltyState:
    output_counts: jax.Array  # [R, V] int32
    prompt_mask: jax.Array  # [R, V] bool

    @classmethod
    def zeros(cls, rows: int, vocab: int) -> "PenaltyState":
        return cls(jnp.zeros((rows, vocab), jnp.int32),
                   jnp.zeros((rows, vocab), jnp.bool_))


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["slots", "presence", "frequency", "repetition",
                                "reset_slots", "count_ids", "count_slots",
                                "count_is_output"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PenaltyParams:
    slots: jax.Array  # [S] int32 state row of each sampled row (scratch if none)
    presence: jax.Array  # [S] float32; 0 = off
    frequency: jax.Array  # [S] float32; 0 = off
    repetition: jax.Array  # [S] float32; 1 = off
    reset_slots: jax.Array  # [S] int32 rows to zero before counting (scratch = none)
    count_ids: jax.Array  # [C] int32 tokens to count this step
    count_slots: jax.Array  # [C] int32 their rows (scratch for padding)
    count_is_output: jax.Array  # [C] bool generated (True) or prompt token


def update_penalty_state(state: PenaltyState, p: PenaltyParams) -> PenaltyState:
    counts = state.output_counts.at[p.reset_slots].set(0)
    mask = state.prompt_mask.at[p.reset_slots].set(False)
    counts = counts.at[p.count_slots, p.count_ids].add(
        p.count_is_output.astype(jnp.int32), mode="drop")
    vocab = mask.shape[-1]
    prompt_ids = jnp.where(p.count_is_output, vocab, p.count_ids)
    mask = mask.at[p.count_slots, prompt_ids].set(True, mode="drop")
    return PenaltyState(counts, mask)


def apply_penalties(logits: jax.Array, state: PenaltyState,
                    p: PenaltyParams) -> jax.Array:
    """vLLM's formulas: repetition divides positive / multiplies negative
    logits of tokens seen in prompt or output; frequency subtracts
    count x penalty, presence subtracts penalty once, both over output tokens."""
    counts = state.output_counts[p.slots]  # [S, V]
    in_output = counts > 0
    seen = in_output | state.prompt_mask[p.slots]
    rep = p.repetition[:, None]
    logits = jnp.where(seen, jnp.where(logits > 0, logits / rep, logits * rep),
                       logits)
    logits = logits - p.frequency[:, None] * counts.astype(logits.dtype)
    return logits - p.presence[:, None] * in_output.astype(logits.dtype)
