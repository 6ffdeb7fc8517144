"""The loaders' hook for quantized linear layers: a linear layer's
checkpoint tensors -> the params of its quantized method.

``weights.build_params`` asks ``linear_params`` about every tensor of the
architecture's spec; for the weight of a quantized linear layer it answers
with that layer's params (read from the checkpoint's quantized tensors, or
quantized from the float weight at load), for anything else None (the
tensor is loaded as usual).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..spec import LinearLayout, StackedExpertsLayout, WeightSpec
from .hf_checkpoints import Get, quantize_linear, read_awq, read_fp8, read_gptq

if TYPE_CHECKING:
    from ..config import ModelConfig


def linear_loader(cfg: ModelConfig, reader: Any) -> Callable[..., Any] | None:
    """``load(spec, get, source) -> [(param path, array)] | None`` for the
    config's quantization; None when the model is not quantized."""
    qc = getattr(cfg, "quantization", None)
    if qc is None:
        return None

    def load(spec: WeightSpec, get: Get, source: str
             ) -> list[tuple[tuple[str, ...], np.ndarray]] | None:
        if isinstance(spec.convert, StackedExpertsLayout):
            return _quantized_experts(cfg, spec, get, source)
        if not isinstance(spec.convert, LinearLayout):
            return None
        path = tuple(spec.path[:-1])
        scheme = qc.method_for(path)
        if scheme is None:
            return None
        prefix = spec.hf_name[:-len("weight")]
        layout = spec.convert
        fmt = qc.checkpoint_format
        if fmt == "float":
            arrays = quantize_linear(scheme, get, prefix, layout, source)
        elif fmt == "awq":
            arrays = read_awq(scheme, get, prefix, layout, source)
        elif fmt in ("gptq", "gptq_v2"):
            arrays = read_gptq(scheme, get, prefix, layout, source,
                               v2=fmt == "gptq_v2")
        elif fmt == "fp8":
            arrays = read_fp8(scheme, get, prefix, layout, source)
        elif fmt == "gguf":
            from .gguf import read_gguf_linear
            kind, raw = reader.quantized(spec.hf_name)
            arrays = read_gguf_linear(kind, raw, layout)
        else:
            raise ValueError(f"no loader reads checkpoint_format {fmt!r} "
                             "tensor by tensor")
        return [(path + (name,), array) for name, array in arrays.items()]

    return load


def _quantized_experts(cfg: ModelConfig, spec: WeightSpec, get: Get,
                       source: str
                       ) -> list[tuple[tuple[str, ...], np.ndarray]] | None:
    """A mixture of experts' stacked projection quantized at load (codes
    and per expert and output scales, ``moe.quantize_experts``); None where
    the experts stay float."""
    from ..moe import expert_codes_dtype, quantize_experts
    from ..weights import _stacked, check_shape
    codes_dtype = expert_codes_dtype(cfg)
    if codes_dtype is None:
        return None
    w = get(spec.hf_name)
    if w is None:
        w = _stacked(spec, get, source, cfg.architecture)
    check_shape(spec, w, source, cfg.architecture)
    codes, scale = quantize_experts(spec.convert(w), codes_dtype)
    return [(spec.path + ("weight",), codes),
            (spec.path + ("weight_scale",), scale)]
