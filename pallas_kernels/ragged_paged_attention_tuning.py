"""Tuning of the ragged paged attention kernels: the frozen, validated
dataclass and the tuned table, kept as data apart from the kernel code.

Block sizes are counted in pages for the KV axis (a KV tile is
``pages_per_block * B`` tokens gathered through the block table) and in tokens
for the query axis of the prefill kernel. The Triton lowering needs every tile
dimension to be a power of two.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

# Streaming multiprocessors of the target GPU (H100/H200: 132). The decode
# kernel splits the KV axis until about this many programs run at once per SM.
NUM_SMS = 132

# Rows of the Mosaic decode kernel's wgmma tile (the GQA group is padded).
MOSAIC_ROWS = 64
# Dynamic shared memory one block may take on Hopper (227 KiB).
SMEM_PER_BLOCK = 227 * 1024


class TuningError(ValueError):
    """A tuning value the kernels cannot use; the message names the field."""


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class MosaicDecodeTuning:
    """Static launch parameters of the Mosaic GPU decode kernel
    (``ragged_paged_attention_decode_mgpu.py``)."""
    tokens_per_step: int = 64  # KV tokens per pipeline step (of 64 and of B)
    num_stages: int = 0  # ring depth in steps; 0 = as many as fit smem_budget
    smem_budget: int = 200 * 1024  # bytes of shared memory per program
    kv_splits: int = 0  # programs per (sequence, kv head); 0 = from S*K
    programs_per_sm: int = 1  # target of the automatic split count
    producer_warpgroup: bool = True  # a second warpgroup issues the copies
    # Mosaic's unsafe_no_auto_barriers (no warpgroup barrier around each
    # copy and smem store; the kernel orders its smem traffic itself).
    no_auto_barriers: bool = False
    # fp8 pages: 16-bit tiles dequantized ahead of the wgmma warpgroup (the
    # producer warpgroup's lead; one warpgroup alone uses one); fewer when
    # the smem budget needs it.
    staging_stages: int = 2
    # V's staging depth when it should differ from K's (0: staging_stages):
    # K's tile is free once QK^T has read it, V's only after PV, so a second
    # V tile lets V's convert of the next step run during this step's PV.
    v_staging_stages: int = 0
    # fp8 pages under bf16 queries: run the two wgmmas in f16 instead (the
    # query rows cast to f16, pages dequantized to f16: one exact convert
    # per pair of codes and an f16 scale multiply instead of a trip through
    # f32, and 3 more mantissa bits; every |q|, |K| and |V| must stay under
    # f16's 65504).
    fp8_f16: bool = False
    # fp8 pages with a producer warpgroup: 1 converts K and V tiles, 2 split
    # them (K in one warpgroup, V in another; three warpgroups in all), 4
    # split each kind again by 64-token half of every step (five
    # warpgroups: more warps to hide the convert's latency; needs
    # tokens_per_step a multiple of 128).
    fp8_producers: int = 1
    # The tokens on the wgmmas' M side and the query rows on N (S^T = K Q^T,
    # O^T = V^T P^T, P^T through a small smem tile): the consumer's logits
    # and output take [tokens, R] and [H, R] with R the group rounded up to
    # 16, 32 or 64, instead of 64-row padded tiles, so it needs far fewer
    # registers. Not with overlap_softmax.
    swap_ab: bool = False
    # Registers per thread the consumer warpgroup raises itself to (0: 232,
    # or 160 for swap_ab with four producers); the producers take what the
    # launch leaves (``registers``).
    consumer_registers: int = 0
    # Measurement only (wrong outputs): "no_math" skips the consumer's
    # wgmmas and softmax, "no_convert" the producers' fp8 dequantization,
    # "copies_only" both; the copies, barriers and releases run as in a
    # real step, so the time left is the copy pipeline's own floor. (With
    # one warpgroup, V's dequantization runs inside the QK^T step, so
    # "no_math" leaves it out too.)
    probe: str = ""
    # With a producer warpgroup: step i's softmax runs while step i + 1's
    # QK^T wgmma does (FlashAttention-3's in-warpgroup overlap; one more
    # logits tile live in registers). Step i + 1's K tile is waited for
    # first, so it wants K staged two deep for fp8 pages. (A ``probe``
    # computes no softmax, so it runs the plain loop.)
    overlap_softmax: bool = False

    def __post_init__(self):
        if self.tokens_per_step % 64 or self.tokens_per_step < 64:
            raise TuningError(f"tokens_per_step={self.tokens_per_step} must be"
                              " a positive multiple of 64 (the K dimension "
                              "of the PV wgmma)")
        if self.num_stages < 0 or self.num_stages == 1:
            raise TuningError(f"num_stages={self.num_stages} must be 0 "
                              "(automatic) or >= 2")
        if self.kv_splits < 0 or self.programs_per_sm < 1:
            raise TuningError("kv_splits must be >= 0 and programs_per_sm >= 1")
        if self.fp8_producers not in (1, 2, 4):
            raise TuningError(f"fp8_producers={self.fp8_producers} must be "
                              "1, 2 or 4")
        if self.fp8_producers == 4 and self.tokens_per_step % 128:
            raise TuningError(
                f"fp8_producers=4 needs tokens_per_step a multiple of 128 "
                f"(two producers per kind, each whole 64-token halves), got "
                f"{self.tokens_per_step}")
        if self.swap_ab and self.overlap_softmax:
            raise TuningError("swap_ab does not take overlap_softmax (its "
                              "consumer runs the plain loop)")
        if self.consumer_registers and not self.producer_warpgroup:
            raise TuningError("consumer_registers needs producer_warpgroup="
                              "True (one warpgroup alone sets no registers)")
        if self.consumer_registers and not (
                self.consumer_registers % 8 == 0
                and 24 <= self.consumer_registers <= 256):
            raise TuningError(f"consumer_registers={self.consumer_registers} "
                              "must be 0 (automatic) or a multiple of 8 in "
                              "[24, 256] (setmaxnreg's range)")
        if self.probe not in ("", "no_math", "no_convert", "copies_only"):
            raise TuningError(f"probe={self.probe!r}: '', 'no_math', "
                              "'no_convert' or 'copies_only'")
        if self.overlap_softmax and not self.producer_warpgroup:
            raise TuningError("overlap_softmax needs producer_warpgroup=True "
                              "(one warpgroup dequantizes V during QK^T)")
        if self.staging_stages < 1 or self.v_staging_stages < 0:
            raise TuningError(f"staging_stages={self.staging_stages} must be"
                              f" >= 1 and v_staging_stages="
                              f"{self.v_staging_stages} >= 0 (0: the same)")

    def _fixed(self, head_dim: int, itemsize: int, rows: int) -> int:
        """Shared memory beside the rings: the query (and output) tile of
        64 padded rows, barriers and table; with swap_ab the ``rows``-row
        query tile, its transposed output and P."""
        if self.swap_ab:
            return rows * (2 * head_dim + self.tokens_per_step) * itemsize \
                + 4 * 1024
        return MOSAIC_ROWS * head_dim * itemsize + 4 * 1024

    def stages(self, head_dim: int, itemsize: int,
               rows: int = MOSAIC_ROWS) -> int:
        step = 2 * self.tokens_per_step * head_dim * itemsize
        fixed = self._fixed(head_dim, itemsize, rows)
        stages = self.num_stages or max(
            2, min(8, (self.smem_budget - fixed) // step))
        self._check_fits(fixed + stages * step, head_dim)
        return stages

    def fp8_stages(self, head_dim: int, itemsize: int,
                   rows: int = MOSAIC_ROWS) -> tuple[int, tuple[int, int]]:
        """(ring, (K staging, V staging)) depths for 1-byte pages: the ring
        of fp8 steps the copies fill and the 16-bit (``itemsize``) K and V
        tiles they are dequantized into for wgmma, all within
        ``smem_budget`` (the deeper staging gives way first). ``rows``:
        swap_ab's query-row width (the group rounded up to 16, 32, 64)."""
        step = 2 * self.tokens_per_step * head_dim  # K + V, one byte each
        tile = step // 2 * itemsize  # one kind's 16-bit tile
        fixed = self._fixed(head_dim, itemsize, rows)
        if self.producer_warpgroup:
            k = self.staging_stages
            v = self.v_staging_stages or k
        else:
            k = v = 1
        # The ring's least depth (or the one set by hand) comes first.
        depth = self.num_stages or 2
        while max(k, v) > 1 and fixed + (k + v) * tile + depth * step > \
                self.smem_budget:
            k, v = (k - (k >= v), v - (v >= k))
        ring = self.num_stages or max(
            2, min(8, (self.smem_budget - fixed - (k + v) * tile) // step))
        self._check_fits(fixed + (k + v) * tile + ring * step, head_dim)
        return ring, (k, v)

    def _check_fits(self, planned: int, head_dim: int) -> None:
        """A plan over the shared memory an SM gives one block is refused
        here, naming what to change, instead of failing in Mosaic's
        lowering: even the least plan (2 ring steps, one staging tile per
        kind) overflows at 256-token steps of head_dim 128. (smem_budget
        only picks the automatic depths: a least plan a little over it
        still runs.)"""
        if planned > SMEM_PER_BLOCK:
            what = ("num_stages" if self.num_stages else "tokens_per_step")
            raise TuningError(
                f"tokens_per_step={self.tokens_per_step} at head_dim="
                f"{head_dim} needs {planned // 1024} KiB of shared memory, "
                f"over the {SMEM_PER_BLOCK // 1024} KiB an SM gives a "
                f"block; lower {what}")

    def registers(self, producers: int) -> tuple[int, int]:
        """(consumer, producer) registers per thread for a program of one
        consumer and ``producers`` producer warpgroups that dequantize fp8
        pages. ptxas gives a setmaxnreg kernel all that its block size
        allows (168 for 384 threads), and a raise only
        completes once the others' cuts freed as many, so the split must
        fit that launch figure times the warpgroups."""
        threads = 128 * (1 + producers)
        launch = min(255, 65536 // threads) // 8 * 8
        consumer = self.consumer_registers or (
            160 if self.swap_ab and producers == 4 else 232)
        # (At most 256 for the consumer still leaves four producers 56,
        # over setmaxnreg's floor of 24.)
        producer = min(160, (launch * (1 + producers) - consumer)
                       // producers // 8 * 8)
        return consumer, producer

    def splits(self, num_seqs: int, num_kv_heads: int, max_steps: int) -> int:
        if self.kv_splits:
            return self.kv_splits
        want = self.programs_per_sm * NUM_SMS // max(1, num_seqs * num_kv_heads)
        splits = 1
        while splits * 2 <= min(want, max_steps, 64):
            splits *= 2
        return splits


@dataclasses.dataclass(frozen=True)
class MosaicPrefillTuning:
    """Static launch parameters of the Mosaic GPU prefill kernel
    (``ragged_paged_attention_prefill_mgpu.py``). The defaults are the
    tuned ones (``benchmarks/kernels/bench_prefill_mgpu.py`` times the
    variants); 128-token steps x 3 stages do not fit shared memory."""
    block_q: int = 64  # query rows per compute warpgroup (2 per program)
    tokens_per_step: int = 128  # KV tokens per pipeline step
    num_stages: int = 2  # K/V ring depth in steps
    schedule_barrier: bool = True  # ping-pong the two compute warpgroups

    def __post_init__(self):
        if self.block_q != 64:
            raise TuningError(f"block_q={self.block_q} must be 64 (one wgmma "
                             "M tile per compute warpgroup)")
        if self.tokens_per_step % 64 or not 64 <= self.tokens_per_step <= 256:
            raise TuningError(f"tokens_per_step={self.tokens_per_step} must be"
                             " 64, 128, 192 or 256 (wgmma K and N tiles)")
        if self.num_stages < 2:
            raise TuningError(f"num_stages={self.num_stages} must be >= 2")

    def smem_bytes(self, head_dim: int, itemsize: int, table: int) -> int:
        tiles = 2 * self.block_q * head_dim * itemsize  # q (then o), 2 wgs
        ring = 2 * self.num_stages * self.tokens_per_step * head_dim * itemsize
        # + barriers and alignment (Mosaic's own count is slightly higher).
        return tiles + ring + 4 * table + 4096


DECODE_BACKENDS = ("auto", "mosaic", "triton")
PREFILL_BACKENDS = DECODE_BACKENDS


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
    # Decode kernel: "auto" = Mosaic GPU on Hopper for the cases it takes,
    # else Triton; "mosaic" forces it (interpreted when interpret=True).
    decode_backend: str = "auto"
    mosaic_decode: MosaicDecodeTuning = MosaicDecodeTuning()
    # Prefill kernel: "auto" = Mosaic GPU on Hopper for the cases it takes
    # (ragged_paged_attention_prefill_mgpu.supports), else Triton; "mosaic"
    # forces it (compiled only: no interpret mode).
    prefill_backend: str = "auto"
    mosaic_prefill: MosaicPrefillTuning = MosaicPrefillTuning()

    def __post_init__(self):
        if self.prefill_backend not in PREFILL_BACKENDS:
            raise TuningError(f"prefill_backend={self.prefill_backend!r} "
                              f"must be one of {PREFILL_BACKENDS}")
        if self.decode_backend not in DECODE_BACKENDS:
            raise TuningError(f"decode_backend={self.decode_backend!r} must be"
                              f" one of {DECODE_BACKENDS}")
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

    def for_itemsize(self, itemsize: int) -> RaggedPagedAttentionTuning:
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


# Tuned block sizes, as data.
# Key: (jax device_kind, head_dim, page_size).
# Value: (decode_pages_per_block, prefill_block_q, prefill_pages_per_block).
# Swept at H=128 page 16 by benchmarks/kernels/bench_attention.py; the other
# keys keep the same tile bytes (a 64-token x 128 decode tile, a 128 x 128
# prefill tile). A key not listed takes the class defaults.
TUNED_BLOCK_SIZES: dict[tuple[str, int, int], tuple[int, int, int]] = {
    ("NVIDIA H200", 64, 16): (8, 128, 8),
    ("NVIDIA H200", 64, 32): (4, 128, 4),
    ("NVIDIA H200", 128, 16): (4, 128, 8),
    ("NVIDIA H200", 128, 32): (2, 128, 4),
    ("NVIDIA H200", 256, 16): (2, 64, 4),
    ("NVIDIA H200", 256, 32): (1, 64, 2),
}
# What every tuned entry sets beside its block sizes.
TUNED_COMMON: dict[str, Any] = dict(decode_prefetch=True, prefill_num_warps=8)
# A device with no entries of its own (an H100, another GPU, the CPU running
# the kernels interpreted) takes this one's until it is tuned: the tiles
# fit any GPU with Hopper's shared memory.
FALLBACK_DEVICE = "NVIDIA H200"


# The Mosaic decode kernel's tuning over fp8 pages: K and V dequantized by
# two producer warpgroups into f16 tiles (e4m3x2 -> f16x2 and an f16 scale
# multiply: fewer instructions than the bf16 route through f32; the query
# rows are cast to f16), 128-token steps, no automatic warpgroup barriers,
# each step's softmax during the next QK^T, two staged tiles of each kind
# in 224 KiB. The fastest of the fp8 variants benchmarks/kernels/
# bench_decode_fp8.py times (pallas_kernels/NOTES.md has the runs).
FP8_MOSAIC_DECODE = MosaicDecodeTuning(tokens_per_step=128,
                                       no_auto_barriers=True,
                                       fp8_producers=2,
                                       fp8_f16=True,
                                       overlap_softmax=True,
                                       smem_budget=224 * 1024)


def default_tuning(head_dim: int, page_size: int,
                   device_kind: str | None = None,
                   kv_itemsize: int = 2) -> RaggedPagedAttentionTuning:
    """The tuned launch parameters for a head dim and page size on a device
    (by default the first jax device, read when the kernel is traced);
    1-byte (fp8) pages at head_dim 128 (where it was tuned) take
    FP8_MOSAIC_DECODE for the Mosaic decode kernel."""
    if device_kind is None:
        device_kind = jax.devices()[0].device_kind
    if not any(key[0] == device_kind for key in TUNED_BLOCK_SIZES):
        device_kind = FALLBACK_DEVICE
    sizes = TUNED_BLOCK_SIZES.get((device_kind, head_dim, page_size))
    if sizes is None:
        tuning = RaggedPagedAttentionTuning()
    else:
        decode_pages, block_q, prefill_pages = sizes
        tuning = RaggedPagedAttentionTuning(
            decode_pages_per_block=decode_pages, prefill_block_q=block_q,
            prefill_pages_per_block=prefill_pages, **TUNED_COMMON)
    if kv_itemsize == 1 and head_dim == 128:
        tuning = dataclasses.replace(tuning, mosaic_decode=FP8_MOSAIC_DECODE)
    return tuning
