"""A scheduled step as the host arrays the step program takes, padded to
its bucket: token ids, positions, the attention metadata (slots, block
tables, KV lengths, cumulative query lengths) and each sequence's logits
row. `packing.pack_step` then flattens them into one transfer.

Vectorized over requests: a NumPy call per request costs microseconds each,
which at hundreds of sequences would be most of the host's share of a step.
"""

from __future__ import annotations

import itertools

import numpy as np

from jaxinfer.models import AttentionMetadata

from ..request import PENDING_TOKEN


def lay_out_step(sched, dims: tuple[int, int, int], block_size: int,
                 prev_rows: dict[str, int], decode_only: bool | None = None,
                 max_q_len: int = 0):
    """``sched`` (ScheduledRequest list) in bucket ``dims`` = (T, S, P) ->
    (input_ids [T], positions [T], AttentionMetadata, logits_idx [S]).
    A PENDING_TOKEN input (the step before's token, not read back yet)
    becomes -1 - r, r its row in ``prev_rows``: the step reads it on the
    device. ``decode_only``: the bucket's flag (default: one token per
    row); ``max_q_len``: the bucket's (> 1 for a verifying bucket)."""
    T, S, P = dims
    B, R = block_size, len(sched)
    q_lens = np.fromiter((len(s.token_ids) for s in sched), np.int32, R)
    n_tok = int(q_lens.sum())
    starts = np.fromiter((s.start_pos for s in sched), np.int32, R)
    t_lens = np.fromiter((len(s.block_table) for s in sched), np.int32, R)
    cu = np.zeros(S + 1, np.int32)
    np.cumsum(q_lens, out=cu[1:R + 1])
    cu[R + 1:] = n_tok
    seq_of = np.repeat(np.arange(R, dtype=np.int32), q_lens)  # [n_tok]
    pos = starts[seq_of] + np.arange(n_tok, dtype=np.int32) - cu[seq_of]
    tables = np.zeros((S, P), np.int32)
    rows = np.repeat(np.arange(R), t_lens)
    cols = np.arange(rows.size) - np.repeat(np.cumsum(t_lens) - t_lens, t_lens)
    tables[rows, cols] = np.fromiter(
        itertools.chain.from_iterable(s.block_table for s in sched),
        np.int32, rows.size)
    input_ids = np.zeros(T, np.int32)
    input_ids[:n_tok] = np.fromiter(
        itertools.chain.from_iterable(s.token_ids for s in sched),
        np.int32, n_tok)
    pending = np.flatnonzero(input_ids[:n_tok] == PENDING_TOKEN)
    if pending.size:  # tokens of the step before, read on the device
        prev = [prev_rows[sched[i].request_id] for i in seq_of[pending]]
        input_ids[pending] = -1 - np.asarray(prev, np.int32)
    positions = np.zeros(T, np.int32)
    positions[:n_tok] = pos
    slots = np.zeros(T, np.int32)  # padding -> the null page
    slots[:n_tok] = tables[seq_of, pos // B] * B + pos % B
    kv_lens = np.zeros(S, np.int32)
    kv_lens[:R] = starts + q_lens
    logits_idx = np.zeros(S, np.int32)
    logits_idx[:R] = cu[1:R + 1] - 1
    # One token per sequence: the attention kernels skip their prefill
    # half (a separate compiled variant of the bucket).
    md = AttentionMetadata(slots, tables, kv_lens, cu,
                           np.array([R], np.int32),
                           decode_only=(n_tok == R if decode_only is None
                                        else decode_only),
                           max_q_len=max_q_len)
    return input_ids, positions, md, logits_idx
