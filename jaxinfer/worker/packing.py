"""One host->device transfer of a step's int32 metadata.

The token ids, positions and attention metadata of a step are concatenated
into one flat int32 buffer on the host and split again inside the jitted
step (static slices: the bucket (T, S, P) fixes every offset), so a step pays
for one small transfer instead of seven.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxinfer.models import AttentionMetadata

# Every field starts on a 256-byte boundary of the buffer: the Mosaic GPU
# kernels check that each operand is 256-byte aligned, and XLA may hand a
# kernel a slice of this buffer (the block table, say) without copying it.
ALIGN = 64  # int32 elements = 256 bytes


@functools.cache  # a few buckets; pack_step runs per step
def _layout(dims: tuple[int, int, int]):
    """(offset, size) of each field for bucket (T, S, P), and the length."""
    T, S, P = dims
    spans, at = [], 0
    for size in (T, T, T, S * P, S, S + 1, 1):
        spans.append((at, size))
        at += -(-size // ALIGN) * ALIGN
    return tuple(spans), at


FIELDS = ("input_ids", "positions", "slot_mapping", "block_tables", "kv_lens",
          "cu_q_lens", "num_seqs")


def field_spans(dims: tuple[int, int, int]) -> dict[str, tuple[int, int]]:
    """Each field's (offset, size) in the buffer of bucket (T, S, P)."""
    return dict(zip(FIELDS, _layout(dims)[0]))


def pack_step(input_ids, positions, md: AttentionMetadata,
              lora_slots=None) -> np.ndarray:
    """[T], [T], metadata of bucket (T, S, P) -> one flat int32 buffer.
    ``lora_slots`` [T] (each token's LoRA slot), when given, follows the
    rest (`unpack_lora_slots`)."""
    S, P = md.block_tables.shape
    T = len(input_ids)
    spans, total = _layout((T, S, P))
    out = np.zeros(total + (0 if lora_slots is None else T), np.int32)
    fields = (input_ids, positions, md.slot_mapping, md.block_tables.reshape(-1),
              md.kv_lens, md.cu_q_lens, md.num_seqs)
    for (at, size), field in zip(spans, fields):
        out[at:at + size] = field
    if lora_slots is not None:
        out[total:] = lora_slots
    return out


def unpack_step(packed, dims: tuple):
    """The inverse of `pack_step` (works on jax and numpy arrays); ``dims`` =
    (T, S, P, decode_only[, max_q_len]) (a `Bucket`), the last two being
    the metadata's static hints."""
    T, S, P, decode_only = dims[:4]
    max_q_len = dims[4] if len(dims) > 4 else 0
    spans, _ = _layout((T, S, P))
    parts = [packed[at:at + size] for at, size in spans]
    input_ids, positions, slots, tables, kv_lens, cu, num_seqs = parts
    return input_ids, positions, AttentionMetadata(
        slots, tables.reshape(S, P), kv_lens, cu, num_seqs,
        decode_only=decode_only, max_q_len=max_q_len)


def unpack_lora_slots(packed, dims: tuple):
    """The [T] LoRA slot ids `pack_step` appended."""
    T, S, P = dims[:3]
    _, total = _layout((T, S, P))
    return packed[total:total + T]
