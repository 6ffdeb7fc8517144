"""Tuning of the ragged paged attention kernels: the frozen, validated
dataclass and the tuned table, kept as data apart from the kernel code.

Block sizes are counted in pages for the KV axis (a KV tile is
``pages_per_block * B`` tokens gathered through the block table) and in tokens
for the query axis of the prefill kernel. The Triton lowering needs every tile
dimension to be a power of two.
"""

from __future__ import annotations

import dataclasses

# Streaming multiprocessors of the target GPU (H100/H200: 132). The decode
# kernel splits the KV axis until about this many programs run at once per SM.
NUM_SMS = 132


class TuningError(ValueError):
    """A tuning value the kernels cannot use; the message names the field."""


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class RaggedPagedAttentionTuning:
    """Static block sizes and launch parameters (hashable: a jit static arg)."""
    decode_pages_per_block: int = 8  # pages per KV tile of the decode kernel
    decode_kv_splits: int = 0  # programs per (sequence, kv head); 0 = from S*K
    decode_programs_per_sm: int = 2  # target for the automatic split count
    decode_num_warps: int = 4
    decode_num_stages: int = 2
    decode_prefetch: bool = False  # carry the next tile's loads in the loop
    prefill_block_q: int = 64  # query tokens per program (one query head)
    prefill_pages_per_block: int = 4  # pages per KV tile of the prefill kernel
    prefill_num_warps: int = 4
    prefill_num_stages: int = 2

    def __post_init__(self):
        for name in ("decode_pages_per_block", "prefill_pages_per_block",
                     "prefill_block_q", "decode_num_warps",
                     "prefill_num_warps"):
            if not _pow2(getattr(self, name)):
                raise TuningError(f"{name}={getattr(self, name)} must be a "
                                  "power of two (Triton tile shapes)")
        if self.prefill_block_q < 16:
            raise TuningError(f"prefill_block_q={self.prefill_block_q} must "
                              "be >= 16 (tensor-core tile rows)")
        if self.decode_kv_splits < 0 or (self.decode_kv_splits
                                         and not _pow2(self.decode_kv_splits)):
            raise TuningError(f"decode_kv_splits={self.decode_kv_splits} must"
                              " be 0 (automatic) or a power of two")
        for name in ("decode_num_stages", "prefill_num_stages",
                     "decode_programs_per_sm"):
            if getattr(self, name) < 1:
                raise TuningError(f"{name} must be >= 1")

    def for_itemsize(self, itemsize: int) -> "RaggedPagedAttentionTuning":
        """4-byte dtypes (f32) halve the prefill tiles to fit shared memory
        (bf16-tuned 128x128 tiles need 256 KiB in f32; an SM has 227)."""
        if itemsize < 4:
            return self
        return dataclasses.replace(
            self, prefill_block_q=max(16, self.prefill_block_q // 2),
            prefill_pages_per_block=max(1, self.prefill_pages_per_block // 2))

    def kv_splits(self, num_seqs: int, num_kv_heads: int,
                  max_blocks: int) -> int:
        """Static KV split count of the decode kernel for S sequences."""
        if self.decode_kv_splits:
            return self.decode_kv_splits
        want = self.decode_programs_per_sm * NUM_SMS // max(
            1, num_seqs * num_kv_heads)
        splits = 1
        while splits * 2 <= min(want, max_blocks, 64):
            splits *= 2
        return splits


# Tuned on one H200 (benchmarks/kernels/bench_attention.py, see NOTES.md),
# keyed by (head_dim, page_size); measured at H=128 page 16, the other keys
# keep the same tile bytes (a 64-token x 128 decode tile, a 128 x 128 prefill
# tile). Missing keys fall back to the defaults above.


def _t(decode_pages, block_q, prefill_pages, **kw):
    return RaggedPagedAttentionTuning(
        decode_prefetch=True, decode_pages_per_block=decode_pages,
        prefill_block_q=block_q, prefill_pages_per_block=prefill_pages,
        prefill_num_warps=8, **kw)


TUNED: dict[tuple[int, int], RaggedPagedAttentionTuning] = {
    (64, 16): _t(8, 128, 8),
    (64, 32): _t(4, 128, 4),
    (128, 16): _t(4, 128, 8),  # measured: NOTES.md v3
    (128, 32): _t(2, 128, 4),
    (256, 16): _t(2, 64, 4),
    (256, 32): _t(1, 64, 2),
}


def default_tuning(head_dim: int, page_size: int) -> RaggedPagedAttentionTuning:
    return TUNED.get((head_dim, page_size), RaggedPagedAttentionTuning())
