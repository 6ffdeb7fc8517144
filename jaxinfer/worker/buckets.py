"""Shape buckets: a server compiles a bounded set of step programs.

Every dynamic size of a step (tokens T, sequences S, pages per sequence P) is
rounded up to a power of two between a floor and the configured maximum.
"""

from __future__ import annotations

import dataclasses
import itertools


def _pow2_ladder(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v < hi:
        out.append(v)
        v *= 2
    out.append(hi)
    return tuple(out)


def _round_up(value: int, ladder: tuple[int, ...]) -> int:
    for b in ladder:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {ladder[-1]}")


@dataclasses.dataclass(frozen=True)
class Buckets:
    tokens: tuple[int, ...]
    seqs: tuple[int, ...]
    pages: tuple[int, ...]

    @classmethod
    def make(cls, max_num_batched_tokens: int, max_num_seqs: int,
             max_pages_per_seq: int) -> "Buckets":
        return cls(tokens=_pow2_ladder(min(16, max_num_batched_tokens),
                                       max_num_batched_tokens),
                   seqs=_pow2_ladder(min(4, max_num_seqs), max_num_seqs),
                   pages=_pow2_ladder(min(4, max_pages_per_seq),
                                      max_pages_per_seq))

    def pick(self, num_tokens: int, num_seqs: int, num_pages: int):
        return (_round_up(num_tokens, self.tokens),
                _round_up(num_seqs, self.seqs),
                _round_up(num_pages, self.pages))

    def all_shapes(self):
        """Every (T, S, P) the engine may run; S never exceeds T."""
        return [(t, s, p) for t, s, p in
                itertools.product(self.tokens, self.seqs, self.pages) if s <= t]
