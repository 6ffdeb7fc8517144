"""Shape buckets: a server compiles a bounded, small set of step programs.

A step is padded to a bucket (T tokens, S sequences, P pages per sequence,
decode_only). Every compiled program of an 8B model takes seconds to build,
so the set is kept to what costs nothing to pad:

- Decode-only steps (one token per sequence): S on a power-of-two ladder,
  T = S (at least the token floor). Their cost follows S (the batch's
  matmuls and sampler), so S keeps its ladder. On CPU (``small_decode``)
  the ladder starts at one sequence and T = S (for models of at least
  10M parameters, `model_runner.SMALL_DECODE_MIN_PARAMS`): XLA CPU runs a one-row dot
  as a matrix-vector product, about 3x faster than the same dot padded to
  16 rows, so a single stream (the README's first command) decodes alone.
- Steps with prefill rows: T on a power-of-two ladder and S = min(T,
  max_num_seqs): a row per possible sequence costs a logits row, little
  next to the T tokens' matmuls, and a second ladder would multiply the
  programs.
- P: a ladder where attention's cost grows with the table width (the
  CPU reference gathers whole tables), a single width where it does not
  (the GPU kernels stop at each sequence's own length).
"""

from __future__ import annotations

import dataclasses


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
    tokens: tuple[int, ...]  # T of steps with prefill rows
    seqs: tuple[int, ...]  # S of decode-only steps
    pages: tuple[int, ...]  # P
    decode_floor: int = 16  # T of a decode-only step is at least this

    @classmethod
    def make(cls, max_num_batched_tokens: int, max_num_seqs: int,
             max_pages_per_seq: int, fixed_pages: bool = False,
             small_decode: bool = False) -> "Buckets":
        pages = ((max_pages_per_seq,) if fixed_pages else
                 _pow2_ladder(min(4, max_pages_per_seq), max_pages_per_seq))
        tokens = _pow2_ladder(min(16, max_num_batched_tokens),
                              max_num_batched_tokens)
        seqs = _pow2_ladder(min(4, max_num_seqs), max_num_seqs)
        if small_decode and seqs[0] > 1:
            seqs = (1,) + seqs
        return cls(tokens=tokens, seqs=seqs, pages=pages,
                   decode_floor=1 if small_decode else tokens[0])

    @property
    def max_num_seqs(self) -> int:
        return self.seqs[-1]

    def pick(self, num_tokens: int, num_seqs: int, num_pages: int,
             decode_only: bool) -> tuple[int, int, int]:
        P = _round_up(num_pages, self.pages)
        if decode_only:
            S = _round_up(num_seqs, self.seqs)
            return max(S, self.decode_floor), S, P
        T = _round_up(num_tokens, self.tokens)
        return T, min(T, self.max_num_seqs), P

    def all_shapes(self) -> list[tuple[int, int, int, bool]]:
        """Every (T, S, P, decode_only) a step can land in."""
        out = []
        for p in self.pages:
            out += [(max(s, self.decode_floor), s, p, True) for s in self.seqs]
            out += [(t, min(t, self.max_num_seqs), p, False)
                    for t in self.tokens]
        return out
