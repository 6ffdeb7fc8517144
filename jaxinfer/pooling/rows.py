"""Host side of pooling: each prompt's pooled vector, assembled from its
chunks' per-row reductions (`step.pooled_forward`), and the per-request
finish (``dimensions``, normalization)."""

from __future__ import annotations

import numpy as np

from .config import PoolerConfig
from .params import PoolingParams

# The [3, D] vectors `step.pooled_forward` returns per row, in order.
SUM, FIRST, LAST = 0, 1, 2


class PooledRows:
    """Partial pools of the prompts being prefilled, by request id."""

    def __init__(self, pooling_type: str):
        self.pooling_type = pooling_type
        self._sums: dict[str, np.ndarray] = {}  # MEAN: running sum (float64)
        self._first: dict[str, np.ndarray] = {}  # CLS: position 0's state

    def release(self, request_ids) -> None:
        for rid in request_ids:
            self._sums.pop(rid, None)
            self._first.pop(rid, None)

    def add(self, sched, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Takes one step's [S, 3, D] reductions for its rows ``sched``
        (ScheduledRequest list, in row order); returns the raw pooled
        vector of each prompt whose last chunk this step ran. A chunk at
        position 0 starts the prompt afresh (a recomputed preemption
        starts over)."""
        done = {}
        for i, s in enumerate(sched):
            rid = s.request_id
            if s.start_pos == 0:
                self.release([rid])
            if self.pooling_type == "MEAN":
                total = self._sums.get(rid)
                chunk = rows[i, SUM].astype(np.float64)
                self._sums[rid] = chunk if total is None else total + chunk
            elif self.pooling_type == "CLS" and s.start_pos == 0:
                self._first[rid] = rows[i, FIRST]
            if not s.sample:  # more of the prompt to come
                continue
            n = s.start_pos + len(s.token_ids)  # the whole prompt
            if self.pooling_type == "MEAN":
                done[rid] = (self._sums.pop(rid) / n).astype(np.float32)
            elif self.pooling_type == "CLS":
                done[rid] = self._first.pop(rid)
            else:
                done[rid] = rows[i, LAST]
        return done


def finish_pooled(vector: np.ndarray, params: PoolingParams,
                  config: PoolerConfig) -> np.ndarray:
    """A request's embedding: cut to ``dimensions`` then L2-normalized
    when asked (the model's default when ``normalize`` is None), as vLLM
    orders the two."""
    out = np.asarray(vector, np.float32)
    if params.dimensions is not None:
        out = out[:params.dimensions]
    normalize = config.normalize if params.normalize is None else params.normalize
    if normalize:
        norm = float(np.linalg.norm(out.astype(np.float64)))
        out = (out / max(norm, 1e-12)).astype(np.float32)
    return out
