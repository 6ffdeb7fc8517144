"""Plain NumPy references for the sampler (vLLM's definitions)."""

from __future__ import annotations

import numpy as np


def softmax(x):
    x = np.asarray(x, np.float64)
    finite = np.isfinite(x)
    e = np.where(finite, np.exp(x - np.max(x[finite])), 0.0)
    return e / e.sum()


def filtered_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution a draw follows: temperature, then min-p, then top-k,
    then top-p on the renormalized survivors."""
    x = np.asarray(logits, np.float64) / temperature
    if min_p > 0:
        p = softmax(x)
        x = np.where(p < min_p * p.max(), -np.inf, x)
    if top_k > 0:
        kth = np.sort(x)[::-1][top_k - 1]
        x = np.where(x < kth, -np.inf, x)
    if top_p < 1.0:
        p = softmax(x)
        order = np.argsort(-x, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros_like(p, bool)
        keep[order[before < top_p]] = True
        x = np.where(keep, x, -np.inf)
    return softmax(x)


def processed_logits(logits, prompt, output, presence=0.0, frequency=0.0,
                     repetition=1.0, bias=None, allowed=None, banned=()):
    """Whitelist, bans, bias, then penalties, one row at a time."""
    x = np.asarray(logits, np.float64).copy()
    V = x.shape[0]
    if allowed:
        mask = np.ones(V, bool)
        mask[list(allowed)] = False
        x[mask] = -np.inf
    for t in banned:
        x[t] = -np.inf
    for t, b in (bias or {}).items():
        x[t] += b
    counts = np.bincount(np.asarray(output, np.int64), minlength=V)
    seen = (counts > 0) | (np.bincount(np.asarray(prompt, np.int64),
                                       minlength=V) > 0)
    for t in np.nonzero(seen)[0]:
        x[t] = x[t] / repetition if x[t] > 0 else x[t] * repetition
    x -= frequency * counts
    x -= presence * (counts > 0)
    return x
