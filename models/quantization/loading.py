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

from ..errors import CheckpointError, ShapeMismatchError
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
    and per expert and output scales, ``moe_weights.quantize_experts``); None where
    the experts stay float."""
    from ..moe_weights import expert_codes_dtype, expert_int4_scheme, quantize_experts
    from ..weights import _stacked, check_shape
    int4 = expert_int4_scheme(cfg)
    if int4 is not None and cfg.quantization.checkpoint_format != "jaxinfer":
        return read_int4_experts(cfg.quantization.checkpoint_format, int4,
                                 spec, get, source)
    codes_dtype = expert_codes_dtype(cfg)
    if codes_dtype is None:
        return None
    if cfg.quantization.checkpoint_format == "fp8":
        codes, scale = read_fp8_experts(spec, get, source)
        return [(spec.path + ("weight",), codes),
                (spec.path + ("weight_scale",), scale)]
    w = get(spec.hf_name)
    if w is None:
        w = _stacked(spec, get, source, cfg.architecture)
    check_shape(spec, w, source, cfg.architecture)
    codes, scale = quantize_experts(spec.convert(w), codes_dtype)
    return [(spec.path + ("weight",), codes),
            (spec.path + ("weight_scale",), scale)]


def read_fp8_experts(spec: WeightSpec, get: Get, source: str
                     ) -> tuple[np.ndarray, np.ndarray]:
    """An fp8 checkpoint's experts of one projection: each expert's e4m3
    ``weight`` [out, in] and ``weight_scale`` (one value, or one per output)
    -> codes [E, in, out] and scales [E, out]. The experts run weight-only
    (the rows stay in the model's dtype), so an expert's ``input_scale`` is
    not read."""
    from .hf_checkpoints import FP8_DTYPE, _tensor
    _, out, In = spec.hf_shape
    if not spec.parts:
        raise CheckpointError(
            f"{source}: {spec.hf_name!r}: an fp8 checkpoint's experts are "
            "read one tensor per expert; this architecture names them stacked")
    codes, scales = [], []
    for name in spec.parts:
        w = _tensor(get, name, (out, In), source)
        if w.dtype != np.dtype(FP8_DTYPE):
            raise CheckpointError(
                f"{source}: tensor {name!r} is {w.dtype}, not float8_e4m3fn "
                "as the fp8 quantization_config says")
        prefix = name[:-len("weight")]
        s = _tensor(get, prefix + "weight_scale", None, source).astype(np.float32)
        if s.size not in (1, out):
            raise ShapeMismatchError(
                f"{source}: {prefix}weight_scale has shape {s.shape}; an "
                f"expert's scales are one value or one per output ({out})")
        codes.append(w.T)
        scales.append(np.broadcast_to(s.reshape(-1), (out,)))
    return np.stack(codes), np.stack(scales).astype(np.float32)


def read_int4_experts(fmt: str, scheme: Any, spec: WeightSpec, get: Get,
                      source: str
                      ) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """An AWQ or GPTQ checkpoint's experts of one projection, each expert
    read as its linear layer would be (``read_awq`` / ``read_gptq``: codes
    [out, in / 2] packed along the input, scales and zeros [out, groups])
    and stacked in the kernel's order: ``qweight`` [E, in / 2, out],
    ``scales`` and ``qzeros`` [E, groups, out]."""
    _, out, In = spec.hf_shape
    if not spec.parts:
        raise CheckpointError(
            f"{source}: {spec.hf_name!r}: an {fmt} checkpoint's experts are "
            "read one tensor per expert; this architecture names them stacked")
    layout = LinearLayout(out_shape=(out,), in_shape=(In,))
    stacks: dict[str, list[np.ndarray]] = {"qweight": [], "scales": [], "qzeros": []}
    for name in spec.parts:
        prefix = name[:-len("weight")]
        if fmt == "awq":
            arrays = read_awq(scheme, get, prefix, layout, source)
        else:
            arrays = read_gptq(scheme, get, prefix, layout, source,
                               v2=fmt == "gptq_v2")
        for key, stack in stacks.items():
            stack.append(np.ascontiguousarray(arrays[key].T))
    return [(spec.path + (key,), np.stack(stack)) for key, stack in stacks.items()]
