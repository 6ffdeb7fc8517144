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
Every count array has one width known at start (`sampling_inputs`): a
step's own tokens fit it, and a fresh slot's earlier tokens go through
`count_tokens` beforehand in chunks of that width, so no request's length
shapes a program.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxinfer.models.attention import StepArray


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["output_counts", "prompt_mask"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PenaltyState:
    output_counts: jax.Array  # [R, V] int32
    prompt_mask: jax.Array  # [R, V] bool

    @classmethod
    def zeros(cls, rows: int, vocab: int) -> PenaltyState:
        return cls(jnp.zeros((rows, vocab), jnp.int32),
                   jnp.zeros((rows, vocab), jnp.bool_))


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["slots", "presence", "frequency", "repetition",
                                "reset_slots", "count_ids", "count_slots",
                                "count_is_output"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PenaltyParams:
    slots: StepArray  # [S] int32 state row of each sampled row (scratch if none)
    presence: StepArray  # [S] float32; 0 = off
    frequency: StepArray  # [S] float32; 0 = off
    repetition: StepArray  # [S] float32; 1 = off
    reset_slots: StepArray  # [S] int32 rows to zero before counting (scratch = none)
    count_ids: StepArray  # [C] int32 tokens to count this step
    count_slots: StepArray  # [C] int32 their rows (scratch for padding)
    count_is_output: StepArray  # [C] bool generated (True) or prompt token


def count_tokens(state: PenaltyState, reset_slots, count_ids, count_slots,
                 count_is_output) -> PenaltyState:
    """Zeroes the rows ``reset_slots`` [R'] and counts ``count_ids`` [C]
    into rows ``count_slots`` [C] (outputs into the counts, prompt tokens
    into the mask; padding ids V are dropped)."""
    counts = state.output_counts.at[reset_slots].set(0)
    mask = state.prompt_mask.at[reset_slots].set(False)
    counts = counts.at[count_slots, count_ids].add(
        count_is_output.astype(jnp.int32), mode="drop")
    vocab = mask.shape[-1]
    prompt_ids = jnp.where(count_is_output, vocab, count_ids)
    mask = mask.at[count_slots, prompt_ids].set(True, mode="drop")
    return PenaltyState(counts, mask)


def update_penalty_state(state: PenaltyState, p: PenaltyParams) -> PenaltyState:
    return count_tokens(state, p.reset_slots, p.count_ids, p.count_slots,
                        p.count_is_output)


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
