"""Rotary position embeddings with HF's scaling types.

Frequencies are computed once on the host (NumPy); the jitted step only
gathers cos/sin rows by position. ``dynamic`` (NTK) scaling is fixed at the
engine's ``max_model_len``: HF recomputes it from the current length, which
would silently change keys already in the cache, so the two agree exactly while
sequences stay within ``max_position_embeddings`` and we keep one consistent
frequency set past it (as vLLM does).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .config import ModelConfig


def _yarn_inv_freq(cfg: ModelConfig, base: float, dim: int
                   ) -> tuple[np.ndarray, float]:
    rs = cfg.rope_scaling
    orig = rs.original_max_position_embeddings or cfg.max_position_embeddings
    factor = rs.factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rs.attention_factor
    if attention_factor is None:
        if rs.mscale and rs.mscale_all_dim:
            attention_factor = mscale(factor, rs.mscale) / mscale(
                factor, rs.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (
            2 * math.log(base))

    low, high = correction_dim(rs.beta_fast), correction_dim(rs.beta_slow)
    if rs.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low),
                   0, 1)
    pos_freqs = base**(np.arange(0, dim, 2, dtype=np.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # share of extrapolation per dimension
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq, float(attention_factor)


def _llama3_inv_freq(cfg: ModelConfig, inv_freq: np.ndarray) -> np.ndarray:
    rs = cfg.rope_scaling
    old_len = rs.original_max_position_embeddings or cfg.max_position_embeddings
    low_wavelen = old_len / rs.low_freq_factor
    high_wavelen = old_len / rs.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
    smooth = (old_len / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def _longrope_inv_freq(cfg: ModelConfig, max_model_len: int
                       ) -> tuple[np.ndarray, float]:
    """Phi-3's LongRoPE: the base frequencies divided by the short factors,
    or by the long ones when the engine serves positions past
    original_max_position_embeddings. HF picks the set from each forward's
    current length, so keys cached under the short set would meet queries
    under the long one; we fix the set for the engine's max_model_len (as
    vLLM does), which is HF's choice for every forward within it when
    max_model_len <= original_max_position_embeddings, and for a forward
    over max_model_len tokens otherwise."""
    rs = cfg.rope_scaling
    orig = rs.original_max_position_embeddings or cfg.max_position_embeddings
    factors = rs.long_factor if max_model_len > orig else rs.short_factor
    dim = cfg.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    inv_freq = 1.0 / (np.asarray(factors, np.float32) *
                      cfg.rope_theta**exponents)
    factor = rs.factor
    attention_factor = rs.attention_factor
    if attention_factor is None:
        attention_factor = (1.0 if factor <= 1.0 else
                            math.sqrt(1 + math.log(factor) / math.log(orig)))
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_inv_freq(cfg: ModelConfig, max_model_len: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies [H/2] and the cos/sin scale (YaRN's mscale)."""
    inv_freq, scale = _scaled_inv_freq(cfg, max_model_len)
    factors = cfg.rope_scaling.freq_factors
    if factors is not None:  # llama.cpp divides theta by them
        inv_freq = inv_freq / np.asarray(factors, np.float32)
    return inv_freq.astype(np.float32), scale


def _scaled_inv_freq(cfg: ModelConfig, max_model_len: int
                     ) -> tuple[np.ndarray, float]:
    dim = cfg.head_dim
    base = cfg.rope_theta
    rs = cfg.rope_scaling
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    if rs.rope_type == "yarn":
        return _yarn_inv_freq(cfg, base, dim)
    if rs.rope_type == "longrope":
        return _longrope_inv_freq(cfg, max_model_len)
    if rs.rope_type == "dynamic":
        seq_len = max(max_model_len, cfg.max_position_embeddings)
        base = base * ((rs.factor * seq_len / cfg.max_position_embeddings) -
                       (rs.factor - 1))**(dim / (dim - 2))
    inv_freq = (1.0 / (base**exponents)).astype(np.float32)
    if rs.rope_type == "linear":
        inv_freq = inv_freq / rs.factor
    elif rs.rope_type == "llama3":
        inv_freq = _llama3_inv_freq(cfg, inv_freq)
    return inv_freq.astype(np.float32), 1.0


def rope_cos_sin_table(cfg: ModelConfig, max_model_len: int) -> np.ndarray:
    """[max_model_len, H] table: cos in the first half, sin in the second,
    already multiplied by the attention factor."""
    inv_freq, scale = rope_inv_freq(cfg, max_model_len)
    pos = np.arange(max_model_len, dtype=np.float32)
    angles = np.outer(pos, inv_freq).astype(np.float32)  # [P, H/2]
    return np.concatenate([np.cos(angles) * scale, np.sin(angles) * scale],
                          axis=-1).astype(np.float32)


def apply_rope(
    x: jax.Array,  # [T, N, H]
    cos_sin: jax.Array,  # [T, H] rows of the table for each token's position
) -> jax.Array:
    """HF's non-interleaved rotation (rotate_half), computed in float32."""
    half = x.shape[-1] // 2
    cos = jnp.concatenate([cos_sin[:, :half]] * 2, axis=-1)[:, None, :]
    sin = jnp.concatenate([cos_sin[:, half:]] * 2, axis=-1)[:, None, :]
    xf = x.astype(jnp.float32)
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)
