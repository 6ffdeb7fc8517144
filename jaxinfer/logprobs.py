"""vLLM's logprob types: per position, a dict token id -> `Logprob`.

Values come from the raw logits (before temperature, penalties and filters),
as vLLM's default ``logprobs_mode="raw_logprobs"``. The device returns, per
position, the chosen token (sampled or prompt token) followed by the top
``max_logprobs`` tokens; ``to_dict`` keeps the chosen one plus the top ``k``
the request asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token under the raw logits
    decoded_token: str | None = None


# One entry per generated token.
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token; the first is None (nothing predicts it).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclasses.dataclass
class LogprobRows:
    """Host copy of some positions' logprobs, column 0 = the chosen token,
    columns 1.. = the top-K tokens in rank order."""
    token_ids: np.ndarray  # [R, 1 + K] int32
    logprobs: np.ndarray  # [R, 1 + K] float32
    ranks: np.ndarray  # [R, 1 + K] int32

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    def slice(self, start: int, stop: int) -> LogprobRows:
        return LogprobRows(self.token_ids[start:stop],
                           self.logprobs[start:stop], self.ranks[start:stop])

    def to_dict(self, row: int, k: int,
                decode: Callable[[int], str] | None = None
                ) -> dict[int, Logprob]:
        """Row ``row`` as vLLM's dict: the chosen token first, then the top
        ``k`` (a chosen token inside the top k appears once)."""
        ids = self.token_ids[row, :1 + k].tolist()
        lps = self.logprobs[row, :1 + k].tolist()
        ranks = self.ranks[row, :1 + k].tolist()
        out: dict[int, Logprob] = {}
        for tid, lp, rank in zip(ids, lps, ranks):
            if tid not in out:
                out[tid] = Logprob(lp, rank,
                                   decode(tid) if decode is not None else None)
        return out


def decode_entry(entry: dict[int, Logprob],
                 decode: Callable[[int], str]) -> dict[int, Logprob]:
    """Fills each token's ``decoded_token`` (in place) and returns the entry:
    an engine core sends logprobs without text, its front end decodes them."""
    for tid, lp in entry.items():
        lp.decoded_token = decode(tid)
    return entry


def make_decoder(tokenizer: Any) -> Callable[[int], str]:
    """Token id -> text as vLLM shows it in ``decoded_token``."""
    cache: dict[int, str] = {}

    def decode(tid: int) -> str:
        s = cache.get(tid)
        if s is None:
            s = tokenizer.decode([tid]) or ""
            cache[tid] = s
        return s

    return decode
