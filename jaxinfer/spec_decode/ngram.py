"""Prompt-lookup (n-gram) proposals, for a whole batch at once on the host.

For each sequence, the longest suffix of n tokens (n from
``prompt_lookup_max`` down to ``prompt_lookup_min``) that also occurs
earlier in its tokens proposes the tokens that followed its most recent
earlier occurrence. Repetitive text (code edits, quoting, summaries of a
document in the prompt) repeats long runs, so the runs that followed last
time are likely to follow again. Draft tokens cost nothing to propose and,
being deterministic, are verified exactly by the sampler
(`verify.py`).

One NumPy pass per suffix length over a [B, L] matrix of the batch's
tokens, each pass growing the matches of the last by one token: no Python
loop over positions.
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
    rows = np.arange(B)
    # match[b, p]: the n tokens ending at position p equal row b's last n
    # tokens, grown by one token per pass (n = j + 1): the passes for every
    # n cost n_max compares of [B, L], not one [B, L, n] compare per n.
    # An occurrence must end before the last token (p <= len - 2), so that
    # at least one token follows it; the suffix itself never qualifies.
    match = np.arange(L)[None, :] <= lens[:, None] - 2
    match &= (limit > 0)[:, None]
    found = np.full(B, -1, np.int64)  # where each row's proposal starts
    for j in range(n_max):
        # Row b's j-th token from its end against every token j before p
        # (rows too short for it have no candidate p left).
        tail = tokens[rows, np.maximum(lens - 1 - j, 0)]
        match[:, :j] = False
        match[:, j:] &= tokens[:, :L - j] == tail[:, None]
        if not match.any():
            break
        n = j + 1
        if n >= n_min:
            # The most recent occurrence; a longer n (a later pass) wins.
            hit = match.any(axis=1)
            last = L - 1 - np.argmax(match[:, ::-1], axis=1)
            found = np.where(hit, last + 1, found)
    out: list[list[int]] = []
    for i in range(B):
        if found[i] < 0:
            out.append([])
            continue
        stop = min(int(found[i] + limit[i]), int(lens[i]))
        out.append(tokens[i, found[i]:stop].tolist())
    return out
