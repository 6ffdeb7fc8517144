"""Verification of draft tokens inside the sampler program.

The forward pass scores k + 1 positions per sequence: its last known token
and its k drafts (a short prefill chunk in the ragged call). Position j's
logits are the target distribution of output token ``sample_index + j``
given the drafts before it. The sampler draws a target token at every
position exactly as a step without speculation would draw it there (same
filters, same PRNG key: the request's seed folded with that output index),
and draft j is accepted while it equals the target drawn at j; the first
position that differs emits its target token instead (the correction),
and a row that accepts all its drafts emits the target after them (the
bonus token).

Why this keeps the target distribution exactly: an n-gram draft x is
deterministic (q is one-hot at x), so Leviathan et al.'s rule accepts x
with probability min(1, p(x) / q(x)) = p(x) and otherwise samples from
norm(max(p - q, 0)) = p without x, renormalised. Drawing t ~ p and
accepting when t == x gives x with probability p(x) and any y != x with
probability p(y) = (1 - p(x)) * p(y) / (1 - p(x)): the same law. Greedy
rows draw the argmax, so they accept exactly the drafts greedy decoding
would have produced. And since each position's draw uses the key a plain
step would use there, a seeded request samples the same tokens with or
without speculation, whatever else shares its batch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ..worker.logprob_ops import LogprobArrays
from ..worker.penalties import update_penalty_state
from ..worker.sampler import SamplingMetadata, sample

# (drafts [S, k], targets [S, k], num_drafts [S]) -> accepted drafts [S].
AcceptRule = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def accept_matching(drafts: jax.Array, targets: jax.Array,
                    num_drafts: jax.Array) -> jax.Array:
    """Drafts accepted: the leading run of positions, among each row's
    real drafts, where the draft equals the target drawn there."""
    k = drafts.shape[1]
    ok = (drafts == targets) & (jnp.arange(k)[None, :] < num_drafts[:, None])
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["token_ids", "num_accepted", "logprobs"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class VerifiedOutput:
    token_ids: jax.Array  # [S, k + 1]: row i emits its first num_accepted[i] + 1
    # Drafts accepted per row, padded with zeros to max_num_seqs rows (the
    # next step, laid out ahead, reads it: overlap.py)
    num_accepted: jax.Array
    logprobs: LogprobArrays | None  # rows [S * (k + 1)], when asked for


def _repeat(x, width: int):
    return None if x is None else jnp.repeat(x, width, axis=0)


def expand_rows(smd: SamplingMetadata, width: int) -> SamplingMetadata:
    """Each row's sampling parameters for its ``width`` scored positions
    (row-major: row i's positions are rows i * width ... of the result),
    position j drawing output index ``positions + j``."""
    fields = {f.name: _repeat(getattr(smd, f.name), width)
              for f in dataclasses.fields(smd) if f.name != "penalties"}
    if smd.positions is not None:
        offsets = jnp.tile(jnp.arange(width, dtype=jnp.int32),
                           smd.positions.shape[0])
        fields["positions"] = fields["positions"] + offsets
    p = smd.penalties
    if p is not None:  # count arrays stay: the state is updated once
        p = dataclasses.replace(
            p, slots=_repeat(p.slots, width), presence=_repeat(p.presence, width),
            frequency=_repeat(p.frequency, width),
            repetition=_repeat(p.repetition, width),
            reset_slots=_repeat(p.reset_slots, width))
    return SamplingMetadata(**fields, penalties=p)


def verify_step(accept_rule: AcceptRule, num_logprobs, logits, penalty_state,
                prev_tokens, smd: SamplingMetadata, drafts, num_drafts,
                shift):
    """The sampler of a speculative engine: ``logits`` [S * (k + 1), V]
    (row i's scored positions in order), ``drafts`` [S, k] (padding
    anything), ``num_drafts`` [S], ``shift`` [S] the drafts the step before
    rejected of a row laid out before they were known (overlap.py: its
    output index is that much lower). Returns (VerifiedOutput,
    penalty_state, each row's last emitted token padded to prev_tokens'
    length)."""
    S, k = drafts.shape
    width = k + 1
    if smd.positions is not None:
        smd = dataclasses.replace(smd, positions=smd.positions - shift)
    if smd.penalties is not None:
        penalty_state = update_penalty_state(penalty_state, smd.penalties)
    out = sample(logits, expand_rows(smd, width), penalty_state, num_logprobs)
    targets = out.token_ids.reshape(S, width)
    accepted = jnp.minimum(accept_rule(drafts, targets[:, :k], num_drafts),
                           num_drafts)
    # Accepted positions emit their draft, the next one its target.
    padded = jnp.concatenate([drafts, targets[:, k:]], axis=1)
    emitted = jnp.where(jnp.arange(width)[None, :] < accepted[:, None],
                        padded, targets)
    last = jnp.take_along_axis(emitted, accepted[:, None], axis=1)[:, 0]
    next_tokens = jnp.zeros_like(prev_tokens).at[:S].set(last)
    accepted = jnp.zeros_like(prev_tokens).at[:S].set(accepted)
    return (VerifiedOutput(emitted, accepted, out.logprobs),
            penalty_state, next_tokens)
