"""A speculative step's host arrays: which logits rows each sequence
scores, and its drafts. Every step of a speculative engine scores k + 1
rows per sequence (rows without drafts score their last one, repeated), so
the forward and sampler programs keep one shape per bucket."""

from __future__ import annotations

import numpy as np


def spec_rows(sched, S: int, k: int, cu_q_lens: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logits_idx [S * (k + 1)], drafts [S, k], num_drafts [S]) for the
    step's rows ``sched``: row i scores the token before its d drafts and
    each draft, i.e. its last d + 1 tokens (d = 0: its last token, as a
    plain step), padded with its last; rows past the batch score token 0."""
    width = k + 1
    R = len(sched)
    d = np.zeros(S, np.int32)
    d[:R] = [s.num_draft_tokens for s in sched]
    drafts = np.zeros((S, k), np.int32)
    for i, s in enumerate(sched):
        if s.num_draft_tokens:
            drafts[i, :s.num_draft_tokens] = s.token_ids[-s.num_draft_tokens:]
    last = np.zeros(S, np.int64)
    last[:R] = cu_q_lens[1:R + 1] - 1
    j = np.arange(width)[None, :]
    idx = (last - d)[:, None] + np.minimum(j, d[:, None])
    idx[R:] = 0
    return idx.reshape(-1).astype(np.int32), drafts, d
