"""Speculation under host/device overlap: step N + 1 is laid out and
enqueued before step N's verified tokens are read, so the host does not
know how many of step N's drafts each row accepted.

The scheduler assumes they were all accepted: a row that verified d drafts
at N continues at N + 1 from position start_N + d + 1, with pages
allocated for that, and its first input (N's last emitted token) pending on
the device. On the device, before anything reads the layout, each such row
moves back by the drafts N rejected, ``shift = d - accepted``: its
positions, K/V slots (read again from its block table), KV length and the
output index its sampler draws at. Pages past the corrected end are given
back once N is read (`Scheduler.reject_drafts`). The draft model's or
EAGLE head's proposal for N + 1 is laid out the same way and corrected by
the same program.

Only drafters that propose on the device take part (a draft model, an
EAGLE head): n-gram lookup drafts from the host's tokens, so its steps
wait for the step before.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..request import PENDING_TOKEN
from ..worker.packing import field_spans, unpack_step


@dataclasses.dataclass(frozen=True)
class RowSources:
    """Where each row of a step laid out ahead finds its correction (host
    arrays over the step's rows): ``prev_row`` its row in the step before
    (whose tokens are pending), ``prev_drafts`` the drafts that row
    verified (0: nothing to correct)."""
    prev_row: np.ndarray  # [R] int32
    prev_drafts: np.ndarray  # [R] int32

    def take(self, rows) -> RowSources:
        """The sources of a subset of the rows (a proposal's)."""
        return RowSources(self.prev_row[rows], self.prev_drafts[rows])

    def padded(self, S: int) -> tuple[np.ndarray, np.ndarray]:
        """(prev_row, prev_drafts) padded to ``S`` rows with zeros (no
        correction)."""
        out = np.zeros((2, S), np.int32)
        n = len(self.prev_row)
        out[0, :n], out[1, :n] = self.prev_row, self.prev_drafts
        return out[0], out[1]


def row_sources(sched, prev_rows: dict[str, int],
                prev_drafts: dict[str, int]) -> RowSources | None:
    """The corrections a step laid out ahead needs: for each row whose
    first input is a pending token, its row in the step before and the
    drafts that row verified. None when no row's input is pending (the
    step before was read: the layout is exact)."""
    R = len(sched)
    row = np.zeros(R, np.int32)
    drafts = np.zeros(R, np.int32)
    pending = False
    for i, s in enumerate(sched):
        if s.token_ids and s.token_ids[0] == PENDING_TOKEN:
            pending = True
            row[i] = prev_rows[s.request_id]
            drafts[i] = prev_drafts.get(s.request_id, 0)
    return RowSources(row, drafts) if pending else None


def shift_layout(block_size: int, bucket, packed, prev_accepted, prev_row,
                 prev_drafts, prev_tokens):
    """``packed`` (a step of bucket ``bucket`` laid out as if the step
    before accepted all its drafts) corrected on the device: each row moves
    back by ``prev_drafts - prev_accepted[prev_row]`` positions (rows with
    no drafts before: 0), its slots read again from its block table, and
    pending input ids (-1 - r) replaced by the step before's tokens.
    Returns (packed, shift [S])."""
    input_ids, positions, md = unpack_step(packed, bucket)
    S, P = md.block_tables.shape
    T = input_ids.shape[0]
    shift = jnp.where(prev_drafts > 0,
                      prev_drafts - prev_accepted[prev_row], 0)
    tok = jnp.arange(T, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(md.cu_q_lens[1:], tok, side="right"),
                      S - 1).astype(jnp.int32)
    real = tok < md.cu_q_lens[md.num_seqs[0]]
    pos = jnp.where(real, positions - shift[seq], positions)
    page = md.block_tables[seq, jnp.clip(pos // block_size, 0, P - 1)]
    slots = jnp.where(real, page * block_size + pos % block_size,
                      md.slot_mapping)
    ids = jnp.where(input_ids < 0,
                    prev_tokens[jnp.maximum(-1 - input_ids, 0)], input_ids)
    spans = field_spans(bucket[:3])
    for name, value in (("input_ids", ids), ("positions", pos),
                        ("slot_mapping", slots),
                        ("kv_lens", md.kv_lens - shift)):
        at, size = spans[name]
        packed = packed.at[at:at + size].set(value.astype(packed.dtype))
    return packed, shift.astype(jnp.int32)


def jit_shift_layout(block_size: int, sharding):
    """`shift_layout` jitted, its outputs placed as the step programs take
    their inputs."""
    return jax.jit(functools.partial(shift_layout, block_size),
                   static_argnums=(0,), out_shardings=(sharding, sharding))
