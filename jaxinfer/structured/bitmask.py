"""Packed token masks: one int32 word per 32 token ids, bit ``t % 32`` of
word ``t // 32`` set when token ``t`` may be sampled (llguidance's layout,
which the sampler unpacks inside the jitted step). A row of all ones
(-1 words) allows everything."""

from __future__ import annotations

import functools
import os

import numpy as np


def words(vocab_size: int) -> int:
    """Words of one row's mask."""
    return (vocab_size + 31) // 32


@functools.lru_cache(maxsize=1)
def _executor():
    import llguidance
    # The masks of a step's rows are computed in parallel, off the GIL.
    return llguidance.LLExecutor(num_threads=max(1, min(os.cpu_count() or 1, 16)))


def fill_bitmasks(matchers) -> np.ndarray:
    """[len(matchers), words] int32: each matcher's next-token mask (the
    matchers share one vocabulary: one engine's)."""
    from llguidance.numpy import fill_next_token_bitmask_par
    vocab_size = matchers[0].vocab_size if matchers else 0
    out = np.full((len(matchers), words(vocab_size)), -1, np.int32)
    if matchers:
        fill_next_token_bitmask_par(
            _executor(), [(m.ll_matcher, i) for i, m in enumerate(matchers)],
            out)
    return out


def allowed(row: np.ndarray, token_id: int) -> bool:
    """Whether a packed row allows ``token_id`` (host-side check)."""
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)
