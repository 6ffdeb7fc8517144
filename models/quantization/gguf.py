"""GGUF (llama.cpp) quantized blocks kept quantized: each served block type
becomes a ``GroupedWeights`` layout, decoded from the block bytes at load.

A GGUF matrix is stored row by row (rows = output features), each row cut
into blocks along the input features. The block layouts, from llama.cpp's
format description (``ggml-common.h``):

- Q8_0, 32 inputs, 34 bytes: f16 ``d``, 32 int8 ``q``; ``w = d * q``.
- Q4_0, 32 inputs, 18 bytes: f16 ``d``, 16 bytes; input ``j`` in the low
  nibble of byte ``j``, input ``j + 16`` in the high one; ``w = d * (q - 8)``.
- Q4_1, 32 inputs, 20 bytes: f16 ``d``, f16 ``m``, 16 bytes as Q4_0;
  ``w = d * q + m``.
- Q4_K, 256 inputs, 144 bytes: f16 ``d``, f16 ``dmin``, 12 bytes of eight
  6-bit scales and eight 6-bit mins, 128 bytes of 4-bit codes (each 32-byte
  run holds two sub-blocks of 32: low nibbles, then high nibbles);
  sub-block ``j``: ``w = (d * sc_j) * q - dmin * m_j``.
- Q6_K, 256 inputs, 210 bytes: 128 bytes of low 4 bits, 64 bytes of high 2
  bits, 16 int8 scales, f16 ``d``; sub-block ``j`` of 16:
  ``w = (d * sc_j) * (q - 32)``.

Scales that are products (Q4_K, Q6_K) are formed once here in float32,
where they are exact (an f16 times a 6- or 8-bit integer); the step then
computes the same expressions llama.cpp's (and the gguf package's)
dequantizers do, so the weights are bit-identical to the dequantized path.
Other block types are not kept quantized (the loader dequantizes them and
says so).
"""

from __future__ import annotations

import numpy as np

from ..spec import LinearLayout
from .methods import GroupedWeights
from .packing import pack_int4_pairs

QK_K = 256

SCHEMES = {
    "Q8_0": GroupedWeights(bits=8, group_size=32, signed=True,
                           scale_dtype="float16"),
    "Q4_0": GroupedWeights(bits=4, group_size=32, zero=8,
                           scale_dtype="float16"),
    "Q4_1": GroupedWeights(bits=4, group_size=32, offsets=True,
                           scale_dtype="float16"),
    "Q4_K": GroupedWeights(bits=4, group_size=32, offsets=True,
                           scale_dtype="float32"),
    "Q6_K": GroupedWeights(bits=8, group_size=16, signed=True,
                           scale_dtype="float32"),
}
BLOCK_BYTES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20),
               "Q4_K": (QK_K, 144), "Q6_K": (QK_K, 210)}


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] bytes -> [...] float32 (from little-endian f16)."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _low_high_32(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of Q4_0/Q4_1 -> [..., 32] codes (low nibbles are
    inputs 0..15, high nibbles 16..31)."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 scale bytes [..., 12] -> (scales, mins) [..., 8] 6-bit."""
    s = s.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def decode_blocks(kind: str, raw: np.ndarray, n_in: int) -> dict:
    """Raw block bytes [rows, bytes] of one matrix -> {codes [rows, In],
    scales [rows, G], offsets [rows, G] where the type has them}."""
    block, nbytes = BLOCK_BYTES[kind]
    rows = raw.shape[0]
    b = np.asarray(raw, np.uint8).reshape(rows, n_in // block, nbytes)
    if kind == "Q8_0":
        return {"codes": b[..., 2:].view(np.int8).reshape(rows, n_in),
                "scales": _f16(b[..., :2])}
    if kind in ("Q4_0", "Q4_1"):
        start = 2 if kind == "Q4_0" else 4
        out = {"codes": _low_high_32(b[..., start:]).reshape(rows, n_in),
               "scales": _f16(b[..., :2])}
        if kind == "Q4_1":
            out["offsets"] = _f16(b[..., 2:4])
        return out
    if kind == "Q4_K":
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales_mins(b[..., 4:16])  # [rows, nb, 8]
        qs = b[..., 16:].reshape(rows, -1, 4, 32)  # four 32-byte runs
        codes = np.stack([qs & 0xF, qs >> 4], axis=3)  # [rows, nb, 4, 2, 32]
        return {"codes": codes.reshape(rows, n_in),
                "scales": (d[..., None] * sc.astype(np.float32)).reshape(
                    rows, -1),
                "offsets": -(dmin[..., None] * mn.astype(np.float32)).reshape(
                    rows, -1)}
    if kind == "Q6_K":
        ql, qh = b[..., :128], b[..., 128:192]
        scales = b[..., 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[..., 208:210])
        # Input e of a block: half = e // 128, low bits from ql[half * 64 +
        # e % 64] >> 4 * (e % 128 // 64), high bits from qh[half * 32 +
        # e % 32] >> 2 * (e % 128 // 32).
        lo_shifts = np.array([0, 4], np.uint8).reshape(2, 1)
        hi_shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
        lo = ((ql.reshape(rows, -1, 2, 1, 64) >> lo_shifts) & 0xF).reshape(
            rows, -1, 2, 128)
        hi = ((qh.reshape(rows, -1, 2, 1, 32) >> hi_shifts) & 3).reshape(
            rows, -1, 2, 128)
        q = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
        return {"codes": q.reshape(rows, n_in),
                "scales": (d[..., None] * scales).reshape(rows, -1)}
    raise KeyError(kind)


def read_gguf_linear(kind: str, raw: np.ndarray, layout: LinearLayout
                     ) -> dict:
    """One matrix's blocks -> the params of ``SCHEMES[kind]``."""
    import math
    O = tuple(layout.out_shape)
    n_in = math.prod(layout.in_shape)
    scheme = SCHEMES[kind]
    dec = decode_blocks(kind, raw, n_in)
    codes = dec["codes"].reshape(*O, n_in)
    params = {"qweight": (pack_int4_pairs(codes) if scheme.bits == 4 else
                          codes.astype(scheme.code_dtype())),
              "scales": dec["scales"].astype(scheme.scale_dtype).reshape(
                  *O, -1)}
    if "offsets" in dec:
        params["offsets"] = dec["offsets"].astype(scheme.scale_dtype).reshape(
            *O, -1)
    return params
