"""Direct calls of a model forward over a hand-packed ragged batch.

Builds ``AttentionMetadata`` the way ``jaxinfer/worker/model_runner.py`` does
(pages handed out in order from page 1; page 0 is the null page) so tests can
read logits at every position, not only the ones the engine samples from.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxinfer.models import AttentionMetadata, run_model
from jaxinfer.pallas_kernels import init_kv_pages


def pack(seqs: list[tuple[list[int], int, list[int]]], block_size: int):
    """seqs: (token_ids, start_pos, block_table) per sequence, in row order.
    Returns input_ids [T], positions [T], md, last-token rows [S]."""
    B = block_size
    T = sum(len(ids) for ids, _, _ in seqs)
    S = len(seqs)
    P = max(len(table) for _, _, table in seqs)
    input_ids = np.zeros(T, np.int32)
    positions = np.zeros(T, np.int32)
    slots = np.zeros(T, np.int32)
    tables = np.zeros((S, P), np.int32)
    kv_lens = np.zeros(S, np.int32)
    cu = np.zeros(S + 1, np.int32)
    last = np.zeros(S, np.int32)
    t = 0
    for i, (ids, start, table) in enumerate(seqs):
        n = len(ids)
        table = np.asarray(table, np.int32)
        pos = np.arange(start, start + n, dtype=np.int32)
        input_ids[t:t + n] = ids
        positions[t:t + n] = pos
        slots[t:t + n] = table[pos // B] * B + pos % B
        tables[i, :len(table)] = table
        kv_lens[i] = start + n
        t += n
        cu[i + 1] = t
        last[i] = t - 1
    md = AttentionMetadata(slots, tables, kv_lens, cu,
                           np.array([S], np.int32))
    return input_ids, positions, md, last


def forward(model):
    """The jitted model forward through ``run_model``, as the runner calls
    it: (params, constants, kv_pages, input_ids, positions, md,
    logits_indices)."""
    return jax.jit(functools.partial(run_model, model))


def packed_prefill_logits(model, params, constants, token_id_lists,
                          block_size: int, dtype) -> list[np.ndarray]:
    """Prefills every sequence in one ragged step (fresh pages) and returns
    the logits [T_i, V] at each of its positions. ``constants``: the
    model's (``model_constants``), e.g. a RoPE table made from another
    config."""
    cfg = model.cfg
    seqs, next_page = [], 1
    for ids in token_id_lists:
        n_pages = -(-len(ids) // block_size)
        seqs.append((list(ids), 0, list(range(next_page, next_page + n_pages))))
        next_page += n_pages
    input_ids, positions, md, _ = pack(seqs, block_size)
    kv = init_kv_pages(cfg.num_layers, next_page, block_size,
                       cfg.num_kv_heads, cfg.head_dim, dtype)
    rows = np.arange(len(input_ids), dtype=np.int32)  # logits at every token
    logits, _ = forward(model)(params, constants, kv, input_ids, positions, md,
                               rows)
    logits = np.asarray(logits)
    cu = np.asarray(md.cu_q_lens)
    return [logits[cu[i]:cu[i + 1]] for i in range(len(seqs))]
