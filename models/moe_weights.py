"""How a mixture-of-experts layer stores its stacked expert projections:
float ``[E, in, out]``, int8 / fp8 codes with one scale per expert and
output feature (``QuantizedExperts``: quantized at load or read from an
fp8 checkpoint), or 4-bit AWQ / GPTQ codes with per-group scales and zeros
(``Int4Weights``); which of them a config asks for, their dequantized
floats, and the Flax params that hold them (``expert_params``). The MoE
block that multiplies them is ``moe.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxinfer.pallas_kernels.grouped_matmul import Int4Weights, contraction, int4_floats

from .config import ModelConfig
from .layers import param

EXPERT_AXES = ("experts", "embed", "mlp")  # gate_proj, up_proj [E, D, F]
DOWN_AXES = ("experts", "mlp", "embed")  # down_proj [E, F, D]


# Quantized experts' code dtype by quantization method, and the checkpoint
# formats they come from: quantized at load ("float"), an fp8 checkpoint's
# e4m3 experts ("fp8"; they run weight-only, see docs/adding-a-model.md),
# or our own layout ("jaxinfer").
EXPERT_CODES = {"fp8": jnp.float8_e4m3fn, "compressed-tensors": jnp.float8_e4m3fn,
                "int8": jnp.int8}
EXPERT_FORMATS = ("float", "fp8", "jaxinfer")


def expert_codes_dtype(cfg: ModelConfig) -> Any:
    """The code dtype of the config's quantized experts (None: float)."""
    q = getattr(cfg, "quantization", None)
    if q is None or q.checkpoint_format not in EXPERT_FORMATS:
        return None
    return EXPERT_CODES.get(q.method)


def expert_int4_scheme(cfg: ModelConfig) -> Any:
    """The ``GroupedWeights`` of 4-bit AWQ / GPTQ experts (None: other).
    Served: zero points, groups of a multiple of 32 inputs (or one group)
    dividing D and F, and inputs in their own order (GPTQ's desc_act
    would gather every expert's rows in its own order)."""
    from .quantization.methods import GroupedWeights
    q = getattr(cfg, "quantization", None)
    if q is None or q.method not in ("awq", "gptq") or \
            q.checkpoint_format not in ("awq", "gptq", "gptq_v2", "jaxinfer"):
        return None
    scheme = q.scheme
    if not (isinstance(scheme, GroupedWeights) and scheme.bits == 4
            and scheme.zeros and not scheme.offsets and not scheme.act_order):
        return None
    sizes = (cfg.hidden_size, getattr(cfg, "moe_intermediate_size", 1))
    if scheme.group_size != -1 and (scheme.group_size % 32 or any(
            n % scheme.group_size for n in sizes)):
        return None
    return scheme


class QuantizedExperts(NamedTuple):
    """Stacked expert weights as codes with one float32 scale per expert
    and output feature: ``w[e, i, o] = codes[e, i, o] * scale[e, o]``."""
    codes: jax.Array  # [E, in, out] int8 / fp8
    scale: jax.Array  # [E, out] float32


# An expert projection: float [E, in, out], codes and scales, or 4-bit
# codes with per-group scales and zeros (Int4Weights: [E, in / 2, out]
# packed, [E, groups, out] each).
ExpertWeights = jax.Array | QuantizedExperts | Int4Weights


def expert_floats(w: ExpertWeights, dtype: Any) -> jax.Array:
    """The float weights [E, in, out] in ``dtype`` (codes dequantized)."""
    if isinstance(w, QuantizedExperts):
        return (w.codes.astype(jnp.float32)
                * w.scale[:, None, :]).astype(dtype)
    if isinstance(w, Int4Weights):
        return int4_floats(w).astype(dtype)
    return w


def expert_shape(w: ExpertWeights) -> tuple[int, int, int]:
    """(E, in, out) of an expert projection, however it is stored."""
    if isinstance(w, Int4Weights):
        E, _, out = w.packed.shape
        return E, contraction(w), out
    E, n_in, out = w.codes.shape if isinstance(w, QuantizedExperts) else w.shape
    return E, n_in, out


def quantize_experts(w: np.ndarray, codes_dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Float [E, in, out] -> (codes, scale [E, out] float32): symmetric,
    amax / 448 (fp8) or amax / 127 (int8, rounded half to even) per expert
    and output feature; the codes made as a quantized linear layer's are
    (``hf_checkpoints``: the same division on every platform)."""
    from .quantization.hf_checkpoints import _fp8_codes, _int8_codes
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)  # [E, out]
    top = 127.0 if codes_dtype == jnp.int8 else float(jnp.finfo(codes_dtype).max)
    scale = np.where(amax > 0, amax / np.float32(top), np.float32(1)).astype(np.float32)
    make = _int8_codes if codes_dtype == jnp.int8 else _fp8_codes
    return np.asarray(make(jnp.asarray(w), scale[:, None, :])), scale


class _QuantizedExpertParams(nn.Module):
    """One projection's quantized experts: ``weight`` codes [E, in, out]
    and ``weight_scale`` [E, out] (the names quantized linear layers use,
    so dummy weights and checkpoints treat them alike)."""
    shape: tuple[int, int, int]
    axes: tuple[str, str, str]
    codes: Any

    @nn.compact
    def __call__(self) -> QuantizedExperts:
        E, _, out = self.shape
        return QuantizedExperts(
            param(self, "weight", self.shape, self.axes, self.codes,
                  nn.initializers.zeros),
            param(self, "weight_scale", (E, out), (self.axes[0], self.axes[2]),
                  jnp.float32, nn.initializers.ones))


class _Int4ExpertParams(nn.Module):
    """One projection's 4-bit experts (AWQ / GPTQ): ``qweight`` [E, in / 2,
    out] uint8, ``scales`` [E, groups, out] and ``qzeros`` [E, groups, out]
    uint8, the names the int4 linear layers use."""
    shape: tuple[int, int, int]
    axes: tuple[str, str, str]
    group_size: int
    scale_dtype: str

    @nn.compact
    def __call__(self) -> Int4Weights:
        E, In, out = self.shape
        G = 1 if self.group_size == -1 else In // self.group_size
        return Int4Weights(
            param(self, "qweight", (E, In // 2, out), self.axes, jnp.uint8,
                  nn.initializers.zeros),
            param(self, "scales", (E, G, out), self.axes,
                  jnp.dtype(self.scale_dtype), nn.initializers.ones),
            param(self, "qzeros", (E, G, out), self.axes, jnp.uint8,
                  nn.initializers.zeros))


def expert_params(module: nn.Module, cfg: Any, dtype: Any
                   ) -> tuple[ExpertWeights, ExpertWeights, ExpertWeights]:
    """gate_proj, up_proj [E, D, F] and down_proj [E, F, D] as the config's
    quantization stores them."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    shapes = (("gate_proj", (E, D, F), EXPERT_AXES),
              ("up_proj", (E, D, F), EXPERT_AXES),
              ("down_proj", (E, F, D), DOWN_AXES))
    codes, int4 = expert_codes_dtype(cfg), expert_int4_scheme(cfg)
    if int4 is not None:
        return tuple(_Int4ExpertParams(shape, axes, int4.group_size,  # type: ignore[return-value]
                                       int4.scale_dtype, name=name)()
                     for name, shape, axes in shapes)
    if codes is not None:
        return tuple(_QuantizedExpertParams(shape, axes, codes, name=name)()  # type: ignore[return-value]
                     for name, shape, axes in shapes)
    return tuple(param(module, name, shape, axes, dtype)  # type: ignore[return-value]
                 for name, shape, axes in shapes)
