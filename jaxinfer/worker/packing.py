"""One host->device transfer of a step's int32 metadata.

The token ids, positions and attention metadata of a step are concatenated
into one flat int32 buffer on the host and split again inside the jitted
step (static slices: the bucket (T, S, P) fixes every offset), so a step pays
for one small transfer instead of seven.
"""

from __future__ import annotations

import numpy as np

from jaxinfer.models import AttentionMetadata


def pack_step(input_ids, positions, md: AttentionMetadata) -> np.ndarray:
    """[T], [T], metadata of bucket (T, S, P) -> flat int32 [3T + S*P + 2S + 2]."""
    return np.concatenate([
        input_ids, positions, md.slot_mapping, md.block_tables.reshape(-1),
        md.kv_lens, md.cu_q_lens, md.num_seqs]).astype(np.int32, copy=False)


def unpack_step(packed, dims: tuple[int, int, int]):
    """The inverse of `pack_step` (works on jax and numpy arrays)."""
    T, S, P = dims
    sizes = (T, T, T, S * P, S, S + 1, 1)
    offsets = np.cumsum((0,) + sizes)
    parts = [packed[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
    input_ids, positions, slots, tables, kv_lens, cu, num_seqs = parts
    return input_ids, positions, AttentionMetadata(
        slots, tables.reshape(S, P), kv_lens, cu, num_seqs)
