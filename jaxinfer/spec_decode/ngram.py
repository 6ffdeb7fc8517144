"""Prompt-lookup (n-gram) proposals, for a whole batch at once on the host.

For each sequence, the longest suffix of n tokens (n from
``prompt_lookup_max`` down to ``prompt_lookup_min``) that also occurs
earlier in its tokens proposes the tokens that followed its most recent
earlier occurrence. Repetitive text (code edits, quoting, summaries of a
document in the prompt) repeats long runs, so the runs that followed last
time are likely to follow again. Draft tokens cost nothing to propose and,
being deterministic, are verified exactly by the sampler
(`verify.py`).

One NumPy pass per n over a [B, L] matrix of the batch's tokens: no
Python loop over positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _batch_matrix(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """[B, L] int64 tokens, right-padded with -1, and each row's length."""
    lens = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    width = int(lens.max()) if len(seqs) else 0
    out = np.full((len(seqs), width), -1, np.int64)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out, lens


def propose_ngram(seqs: Sequence[Sequence[int]], max_drafts: Sequence[int],
                  n_min: int, n_max: int) -> list[list[int]]:
    """Draft tokens for each sequence of ``seqs`` (its tokens so far), at
    most ``max_drafts[i]`` for sequence i (0: none); [] where no suffix
    recurs."""
    B = len(seqs)
    if B == 0:
        return []
    tokens, lens = _batch_matrix(seqs)
    L = tokens.shape[1]
    limit = np.asarray(max_drafts, np.int64)
    found = np.full(B, -1, np.int64)  # where each row's proposal starts
    rows = np.arange(B)
    for n in range(n_max, n_min - 1, -1):
        todo = (found < 0) & (lens > n) & (limit > 0)
        if not todo.any() or L <= n:
            continue
        # [B, n] each row's last n tokens.
        suffix = tokens[rows[:, None], lens[:, None] - n + np.arange(n)]
        windows = np.lib.stride_tricks.sliding_window_view(tokens, n, axis=1)
        hit = np.all(windows == suffix[:, None, :], axis=2)  # [B, L - n + 1]
        # An occurrence must end before the suffix starts being itself:
        # start + n < len, so at least one token follows it.
        starts = np.arange(hit.shape[1])
        hit &= starts[None, :] + n < lens[:, None]
        # The most recent occurrence.
        last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
        ok = todo & hit.any(axis=1)
        found = np.where(ok, last + n, found)
    out: list[list[int]] = []
    for i in range(B):
        if found[i] < 0:
            out.append([])
            continue
        stop = min(int(found[i] + limit[i]), int(lens[i]))
        out.append(tokens[i, found[i]:stop].tolist())
    return out
