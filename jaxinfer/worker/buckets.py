"""Shape buckets: a server compiles a bounded, small set of step programs.

A step is padded to a bucket (T tokens, S sequences, P pages per sequence,
decode_only). Every compiled program of a large model takes seconds to
build, so the set is kept to what costs little to pad:

- Decode-only steps (one token per sequence): S on a power-of-two ladder,
  T = S (at least the token floor). Their cost follows S (the batch's
  matmuls and sampler), so S keeps its ladder. On CPU (``small_decode``)
  the ladder starts at one sequence and T = S (for models of at least
  `step_programs.SMALL_DECODE_MIN_PARAMS`): XLA CPU runs a one-row dot
  as a matrix-vector product, much faster than the same dot padded to 16
  rows, so a single stream decodes alone.
- Steps with prefill rows: T on a power-of-two ladder and S = min(T,
  max_num_seqs): a row per possible sequence costs a logits row, little
  next to the T tokens' matmuls, and a second ladder would multiply the
  programs.
- Verifying steps of a speculative engine (every row samples, none
  brings more than its k drafts and one more token): S on the decode
  ladder and T = S (k + 1), rounded up to 16, when its T + S (k + 1)
  rows (tokens through the model, sampled rows through the head and the
  sampler) are no more than the prefill bucket's. A verifying step scores
  k + 1 rows per sequence, so the prefill buckets' S = min(T,
  max_num_seqs) would sample up to max_num_seqs (k + 1) rows for a batch
  of a few.
- P: a ladder where attention's cost grows with the table width (the
  CPU reference gathers whole tables), a single width where it does not
  (the GPU kernels stop at each sequence's own length).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

# A verifying bucket's T is a multiple of this (the prefill ladder's
# smallest T, which the attention kernels' query tiles divide).
VERIFY_TOKEN_ALIGN = 16


class Bucket(NamedTuple):
    """The padded shape a step runs in; static to its programs."""
    tokens: int  # T: token rows
    seqs: int  # S: sequence rows (block tables, logits rows)
    pages: int  # P: pages per sequence (block table width)
    decode_only: bool  # every sequence brings one token
    # > 1: a verifying step's bucket, every sequence brings at most this
    # many tokens (k + 1), which the attention kernels serve as decodes.
    max_q_len: int = 0


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
    verify_width: int = 0  # k + 1 under speculative decoding (else 0)

    @classmethod
    def make(cls, max_num_batched_tokens: int, max_num_seqs: int,
             max_pages_per_seq: int, fixed_pages: bool = False,
             small_decode: bool = False, verify_width: int = 0) -> Buckets:
        pages = ((max_pages_per_seq,) if fixed_pages else
                 _pow2_ladder(min(4, max_pages_per_seq), max_pages_per_seq))
        tokens = _pow2_ladder(min(16, max_num_batched_tokens),
                              max_num_batched_tokens)
        seqs = _pow2_ladder(min(4, max_num_seqs), max_num_seqs)
        if small_decode and seqs[0] > 1:
            seqs = (1,) + seqs
        return cls(tokens=tokens, seqs=seqs, pages=pages,
                   decode_floor=1 if small_decode else tokens[0],
                   verify_width=verify_width)

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

    def bucket(self, num_tokens: int, num_seqs: int, num_pages: int,
               all_sample: bool = True, longest: int | None = None) -> Bucket:
        """The bucket of a step of ``num_seqs`` sequences bringing
        ``num_tokens`` tokens over at most ``num_pages`` pages each.
        ``all_sample``: every row ends at its request's last known token.
        ``longest``: the most tokens a row brings (default: the most the
        counts allow); a verifying bucket takes only rows of at most k + 1.
        A one-token row inside a prompt makes a prefill bucket, so a
        decode-only bucket never scores prompt tokens and needs no
        prompt-logprob variant."""
        decode_only = num_tokens == num_seqs and all_sample
        T, S, P = self.pick(num_tokens, num_seqs, num_pages, decode_only)
        if longest is None:
            longest = num_tokens - num_seqs + 1
        if (self.verify_width and all_sample and not decode_only
                and longest <= self.verify_width):
            verify = self._verify_shape(_round_up(num_seqs, self.seqs))
            w = self.verify_width
            # Fewer rows in all: tokens through the model, sampled rows
            # through the head and the sampler.
            if verify is not None and verify[0] + verify[1] * w <= T + S * w:
                return Bucket(*verify, P, False, self.verify_width)
        return Bucket(T, S, P, decode_only)

    def _verify_shape(self, S: int) -> tuple[int, int] | None:
        """(T, S) of a verifying step of S sequences (None: over the
        largest T)."""
        T = -(-S * self.verify_width // VERIFY_TOKEN_ALIGN) * VERIFY_TOKEN_ALIGN
        return (T, S) if T <= self.tokens[-1] else None

    def all_shapes(self) -> list[Bucket]:
        """Every bucket a step can land in."""
        out = []
        for p in self.pages:
            out += [Bucket(max(s, self.decode_floor), s, p, True)
                    for s in self.seqs]
            out += [Bucket(t, min(t, self.max_num_seqs), p, False)
                    for t in self.tokens]
            if self.verify_width:
                verify = [self._verify_shape(s) for s in self.seqs]
                out += [Bucket(*v, p, False, self.verify_width)
                        for v in verify if v is not None]
        return out
