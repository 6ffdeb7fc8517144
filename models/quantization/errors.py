"""Typed errors of quantized loading. Each is a ValueError (bad input, not
a bug) whose message says what to change; the CLI exits 2 on them and the
server never starts with them."""

from __future__ import annotations

from ..errors import CheckpointError, ModelConfigError


class QuantizationError(ValueError):
    """Base of every quantization error below."""


class UnknownQuantizationError(QuantizationError):
    """A ``quantization`` name (or a checkpoint's ``quant_method``) that
    jaxinfer does not implement; the message lists the ones it does."""


class QuantizationMismatchError(QuantizationError, CheckpointError):
    """The checkpoint's own format does not match the ``quantization``
    asked for (an AWQ checkpoint with ``quantization="gptq"``, ``awq`` on
    an unquantized checkpoint, ...)."""


class UnsupportedQuantizationConfigError(QuantizationError, ModelConfigError):
    """A quantization_config jaxinfer cannot serve: a group size the matmul
    does not take, a bit width other than 4/8, block-wise fp8 scales, ..."""


class UnsupportedGroupSizeError(UnsupportedQuantizationConfigError):
    """A group size the grouped matmul does not take (it must be -1, or a
    multiple of 8 that divides every quantized layer's input features)."""


class Fp8UnsupportedDeviceError(QuantizationError):
    """fp8 matmuls asked for on a GPU without fp8 tensor cores (compute
    capability below 8.9)."""
