"""Quantized linear layers: int8 and fp8 weights, AWQ / GPTQ int4 groups,
GGUF blocks kept quantized (``jaxinfer.models.quantization``).

``resolve.resolve_quantization`` turns vLLM's ``quantization`` argument and
the checkpoint's own config into a ``QuantizationConfig``, carried on
``ModelConfig.quantization``; the layers take their ``LinearMethod`` from
it (``linear_method``), and the loaders read each quantized layer's
tensors through ``loading.linear_loader``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..layers import UNQUANTIZED, LinearMethod
from .config import METHODS, QuantizationConfig, normalize_method
from .errors import (
    Fp8UnsupportedDeviceError,
    QuantizationError,
    QuantizationMismatchError,
    UnknownQuantizationError,
    UnsupportedGroupSizeError,
    UnsupportedQuantizationConfigError,
)
from .methods import Fp8Weights, GroupedWeights, Int8Weights, QuantizedLinear

if TYPE_CHECKING:
    from ..config import ModelConfig


def linear_method(cfg: ModelConfig) -> LinearMethod:
    """The ``LinearMethod`` of the config's linear layers."""
    q = getattr(cfg, "quantization", None)
    return UNQUANTIZED if q is None else q.linear_method()


__all__ = [
    "METHODS", "QuantizationConfig", "normalize_method", "linear_method",
    "QuantizationError", "UnknownQuantizationError",
    "QuantizationMismatchError", "UnsupportedQuantizationConfigError",
    "UnsupportedGroupSizeError", "Fp8UnsupportedDeviceError", "Fp8Weights",
    "GroupedWeights", "Int8Weights", "QuantizedLinear",
]
