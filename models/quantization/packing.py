"""Host-side (NumPy) packing of integer codes: the checkpoint formats'
int32 words in, our device layout out.

Our 4-bit layout (``GroupedWeights``): codes [*O, In] packed two per byte
along the input axis, input ``2j`` in the low nibble of byte ``j``.

The formats' layouts, from their public descriptions:

- AutoAWQ (GEMM version): ``qweight`` int32 [in, out / 8], each word holding
  8 output columns of one input row, 4 bits each; column ``8c + ORDER[i]``
  sits in bits ``4i .. 4i + 3`` of word ``c``, ORDER = 0, 2, 4, 6, 1, 3, 5,
  7 (the interleave its GEMM kernel reads). ``qzeros`` int32 [groups,
  out / 8] is packed the same way.
- AutoGPTQ: ``qweight`` int32 [in * bits / 32, out], each word holding
  32 / bits consecutive input rows of one column, row ``r * (32 / bits) + j``
  in bits ``bits * j ..``; ``qzeros`` int32 [groups, out * bits / 32] holds
  consecutive columns the same way, each stored as zero - 1 in the original
  ("v1") format.
"""

from __future__ import annotations

import numpy as np

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_words(words: np.ndarray, bits: int, axis: int,
                 order: tuple[int, ...] | None = None) -> np.ndarray:
    """int32 words -> uint codes, each word's 32 / bits fields spread along
    ``axis`` (which grows by that factor). Field ``i`` of a word (bits
    ``bits * i ..``) lands at position ``order[i]`` of its run (default: i)."""
    per = 32 // bits
    u = np.ascontiguousarray(words).view(np.uint32)
    axis %= u.ndim
    shifts = np.arange(per, dtype=np.uint32) * bits
    fields = (u[..., None] >> shifts) & np.uint32((1 << bits) - 1)  # [..., per]
    if order is not None:
        # fields[..., i] is position order[i]: invert to place by position.
        fields = fields[..., np.argsort(order)]
    fields = np.moveaxis(fields, -1, axis + 1)
    shape = list(u.shape)
    shape[axis] *= per
    return fields.reshape(shape).astype(np.uint8)


def pack_words(codes: np.ndarray, bits: int, axis: int,
               order: tuple[int, ...] | None = None) -> np.ndarray:
    """The inverse of ``unpack_words`` (tests write checkpoints with it)."""
    per = 32 // bits
    codes = np.asarray(codes, np.uint32)
    axis %= codes.ndim
    codes = np.moveaxis(codes, axis, -1)
    runs = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // per, per))
    if order is not None:
        runs = runs[..., list(order)]  # field i holds position order[i]
    shifts = np.arange(per, dtype=np.uint32) * bits
    words = np.bitwise_or.reduce(runs << shifts, axis=-1)
    return np.moveaxis(words, -1, axis).view(np.int32)


def pack_int4_pairs(codes: np.ndarray) -> np.ndarray:
    """uint codes [..., In] (values < 16) -> uint8 [..., In / 2], input 2j
    in the low nibble of byte j (our device layout)."""
    c = np.asarray(codes, np.uint8)
    if c.shape[-1] % 2:
        raise ValueError(f"4-bit codes need an even input size, got "
                         f"{c.shape[-1]}")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack_int4_pairs(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., n] -> uint8 codes [..., 2n]: NumPy's ``unpack_int4``."""
    p = np.asarray(packed, np.uint8)
    return np.stack([p & 0xF, p >> 4], axis=-1).reshape(
        p.shape[:-1] + (2 * p.shape[-1],))
