"""vLLM's ``quantization`` argument + the checkpoint's own quantization
-> one ``QuantizationConfig`` (or None), with vLLM's rules:

- no argument: the checkpoint's ``quantization_config`` (config.json, or
  AutoGPTQ/AutoAWQ's ``quantize_config.json`` / ``quant_config.json``) is
  used as it is; an unquantized checkpoint stays unquantized. GGUF files are
  dequantized unless ``quantization="gguf"`` asks to keep them quantized (a
  departure: vLLM always keeps them; here the float path is the default so
  GGUF runs keep their exact float32 numerics on CPU).
- an argument naming the checkpoint's method (or an alias: awq_marlin,
  gptq_marlin) serves it; one naming another method is a
  ``QuantizationMismatchError`` — except ``int8`` / ``fp8`` on an
  unquantized (or GGUF) checkpoint, which quantize its weights at load.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..spec import LinearLayout
from .config import QuantizationConfig, normalize_method
from .errors import (
    Fp8UnsupportedDeviceError,
    QuantizationMismatchError,
    UnknownQuantizationError,
    UnsupportedGroupSizeError,
    UnsupportedQuantizationConfigError,
)
from .methods import Fp8Weights, GroupedWeights, Int8Weights

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..gguf_loader import GGUFReader

logger = logging.getLogger(__name__)

# Files older AutoGPTQ / AutoAWQ exports keep their config in.
QUANT_CONFIG_FILES = ("quantize_config.json", "quant_config.json")


def linear_weights(cfg: ModelConfig
                   ) -> Iterator[tuple[tuple[str, ...], str, LinearLayout]]:
    """(layer param path, HF name prefix, LinearLayout) of every linear
    layer of the config's architecture."""
    from ..weights import weight_specs
    for spec in weight_specs(cfg):
        if isinstance(spec.convert, LinearLayout):
            yield (tuple(spec.path[:-1]), spec.hf_name[:-len("weight")],
                   spec.convert)


def checkpoint_quantization(hf: dict, model_dir: str | None) -> dict | None:
    """The checkpoint's own quantization config, or None."""
    q = hf.get("quantization_config")
    if q:
        return dict(q)
    for name in QUANT_CONFIG_FILES:
        path = os.path.join(model_dir or "", name)
        if model_dir and os.path.isfile(path):
            with open(path) as f:
                q = json.load(f)
            # AutoAWQ's file names no method; AutoGPTQ's may not either.
            if "quant_method" not in q:
                q["quant_method"] = ("awq" if "w_bit" in q or "zero_point" in q
                                     or "version" in q else "gptq")
            return q
    return None


def check_fp8_device() -> None:
    """fp8 matmuls need fp8 tensor cores on a GPU (compute capability 8.9:
    Ada, Hopper and later); CPUs run them through XLA's upcast."""
    import jax
    dev = jax.devices()[0]
    cc = getattr(dev, "compute_capability", None)
    if dev.platform == "gpu" and cc is not None and float(cc) < 8.9:
        raise Fp8UnsupportedDeviceError(
            f"quantization='fp8' needs fp8 tensor cores (compute capability "
            f">= 8.9: Ada, Hopper); {dev.device_kind} has {cc}: use "
            "quantization='int8' (weight-only) or an AWQ/GPTQ checkpoint")


def _grouped(q: dict, method: str, source: str) -> tuple[str, GroupedWeights]:
    """(checkpoint_format, scheme) of an AWQ or GPTQ quantization_config."""
    bits = int(q.get("bits", q.get("w_bit", 4)))
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise UnsupportedQuantizationConfigError(
                f"{source}: AWQ version {version!r} is not served (its "
                "packing differs); export the checkpoint with AutoAWQ's "
                "'gemm' version")
        if not q.get("zero_point", True):
            raise UnsupportedQuantizationConfigError(
                f"{source}: AWQ without zero points (zero_point=false) is "
                "not served")
        if bits != 4:
            raise UnsupportedQuantizationConfigError(
                f"{source}: AWQ with {bits} bits is not served (4 only)")
        return "awq", GroupedWeights(bits=4, group_size=group, zeros=True)
    if q.get("is_marlin_format"):
        raise UnsupportedQuantizationConfigError(
            f"{source}: GPTQ checkpoints repacked for Marlin "
            "(is_marlin_format) are not served; use the original GPTQ export")
    if bits not in (4, 8):
        raise UnsupportedQuantizationConfigError(
            f"{source}: GPTQ with {bits} bits is not served (4 or 8)")
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise UnsupportedQuantizationConfigError(
            f"{source}: GPTQ checkpoint_format {fmt!r} is not served "
            "(gptq or gptq_v2)")
    act_order = bool(q.get("desc_act", False)) and group != -1
    return fmt, GroupedWeights(bits=bits, group_size=group, zeros=True,
                               act_order=act_order)


def _fp8(q: dict, source: str) -> Fp8Weights:
    """The scheme of an fp8 checkpoint: vLLM's ``quant_method: fp8`` or
    compressed-tensors' float-quantized W8A8 / W8A16."""
    if q["quant_method"] == "fp8":
        if q.get("weight_block_size"):
            raise UnsupportedQuantizationConfigError(
                f"{source}: block-wise fp8 scales (weight_block_size="
                f"{q['weight_block_size']}) are not served; per-tensor and "
                "per-channel scales are")
        static = q.get("activation_scheme", "dynamic") == "static"
        return Fp8Weights(per_channel=False,
                          activation="static" if static else "per_tensor")
    groups = list((q.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise UnsupportedQuantizationConfigError(
            f"{source}: compressed-tensors with {len(groups)} config groups is "
            "not served (one group of fp8 weights is)")
    wq, aq = groups[0].get("weights") or {}, groups[0].get("input_activations")
    if wq.get("type") != "float" or int(wq.get("num_bits", 0)) != 8:
        raise UnsupportedQuantizationConfigError(
            f"{source}: compressed-tensors weights of type {wq.get('type')!r} "
            f"with {wq.get('num_bits')} bits are not served (fp8 float "
            "weights are; int4/int8 compressed-tensors are not)")
    strategy = wq.get("strategy", "tensor")
    if strategy not in ("tensor", "channel"):
        raise UnsupportedQuantizationConfigError(
            f"{source}: compressed-tensors weight strategy {strategy!r} is "
            "not served (tensor or channel)")
    if aq is None:
        activation = "none"
    elif aq.get("dynamic", True):
        activation = ("per_token" if aq.get("strategy") == "token"
                      else "per_tensor")
    else:
        activation = "static"
    return Fp8Weights(per_channel=strategy == "channel", activation=activation)


def from_checkpoint(q: dict, source: str) -> QuantizationConfig:
    """The QuantizationConfig of a checkpoint's quantization_config."""
    method = str(q.get("quant_method", "")).lower()
    if method in ("awq", "gptq"):
        fmt, scheme = _grouped(q, method, source)
        return QuantizationConfig(method, fmt, scheme)
    if method in ("fp8", "compressed-tensors"):
        return QuantizationConfig(method, "fp8", _fp8(q, source))
    try:
        normalize_method(method)
    except UnknownQuantizationError as e:
        raise UnknownQuantizationError(
            f"{source}: the checkpoint is quantized with {method!r}, which "
            f"jaxinfer cannot load ({e})") from None
    raise UnknownQuantizationError(
        f"{source}: quantization_config with quant_method {method!r} is not "
        "a checkpoint format jaxinfer reads")


def at_load(method: str) -> QuantizationConfig:
    """int8 / fp8 quantized from the float weights at load."""
    if method == "int8":
        return QuantizationConfig("int8", "float", Int8Weights())
    # Per-channel weight scales with per-token activation scales rather
    # than vLLM's per-tensor W8A8: no whole-tensor amax before each GEMM,
    # and closer to the float model (docs/performance.md, "Quantized
    # steps" and "Quantization accuracy on the embedded model").
    return QuantizationConfig("fp8", "float",
                              Fp8Weights(per_channel=True,
                                         activation="per_token"))


def _same_method(asked: str, have: str) -> bool:
    return asked == have or {asked, have} == {"fp8", "compressed-tensors"}


def _mismatch(requested: str | None, have: str,
              source: str) -> QuantizationMismatchError:
    return QuantizationMismatchError(
        f"quantization={requested!r} does not match {source}, whose weights "
        f"are quantized with {have!r}: leave quantization unset (the "
        f"checkpoint's own method is used) or pass quantization={have!r}")


def resolve_quantization(requested: str | None, cfg: ModelConfig, hf: dict,
                         fmt: str, source: str, model_dir: str | None = None,
                         names: Iterable[str] | None = None,
                         gguf_reader: GGUFReader | None = None
                         ) -> QuantizationConfig | None:
    """``fmt``: "safetensors" | "gguf" | "orbax"; ``names``: the tensor
    names of a safetensors checkpoint (None for dummy weights);
    ``gguf_reader``: the parsed GGUF (for its tensor types)."""
    want = normalize_method(requested) if requested else None
    if fmt == "orbax":
        saved = hf.get("quantization_config")
        if saved and saved.get("checkpoint_format") == "jaxinfer":
            qc = QuantizationConfig.from_json(saved)
            if want is not None and not _same_method(want, qc.method):
                raise _mismatch(requested, qc.method, source)
            return _checked(qc, cfg, source)
        if want is not None:
            raise QuantizationMismatchError(
                f"quantization={requested!r}: {source} was converted without "
                "quantization; convert it again with --quantization "
                f"{requested}, or leave quantization unset")
        return None
    if fmt == "gguf":
        if want is None:
            return None
        if want == "gguf":
            if gguf_reader is None:
                raise ValueError(f"{source}: quantization='gguf' needs the "
                                 "parsed GGUF file (gguf_reader)")
            return _checked(gguf_quantization(cfg, gguf_reader, source), cfg,
                            source)
        if want in ("int8", "fp8"):
            # Worth a warning: the file's own blocks are dropped, and the
            # new codes carry the file's rounding on top of their own.
            logger.warning(
                "%s: quantization=%r re-quantizes the GGUF file's "
                "dequantized weights at load (its own quantized blocks are "
                "not kept; quantization='gguf' keeps them)", source, requested)
            return _checked(at_load(want), cfg, source)
        raise _mismatch(requested, "gguf", source)
    q = checkpoint_quantization(hf, model_dir)
    if q is None:
        if want is None:
            return None
        if want in ("int8", "fp8"):
            return _checked(at_load(want), cfg, source)
        raise QuantizationMismatchError(
            f"quantization={requested!r} needs a checkpoint quantized with "
            f"{want}, but {source} has no quantization_config (config.json) "
            f"nor {' / '.join(QUANT_CONFIG_FILES)}: pass quantization='int8' "
            "or 'fp8' to quantize its float weights at load, or leave it "
            "unset")
    qc = from_checkpoint(q, source)
    if want is not None and not _same_method(want, qc.method):
        raise _mismatch(requested, qc.method, source)
    if names is not None:
        qc = _with_unquantized_layers(qc, cfg, set(names))
    return _checked(qc, cfg, source)


def _with_unquantized_layers(qc: QuantizationConfig, cfg: ModelConfig,
                             names: set[str]) -> QuantizationConfig:
    """Layers the checkpoint stores as plain float weights (AWQ's
    modules_to_not_convert, compressed-tensors' ignore list) stay
    unquantized."""
    marker = "weight_scale" if qc.checkpoint_format == "fp8" else "qweight"
    plain = tuple((path, None) for path, prefix, _ in linear_weights(cfg)
                  if prefix + marker not in names and prefix + "weight" in names)
    return QuantizationConfig(qc.method, qc.checkpoint_format, qc.scheme,
                              plain)


def gguf_quantization(cfg: ModelConfig, reader: GGUFReader,
                      source: str) -> QuantizationConfig:
    """Each linear layer's method from its GGUF block type; a type not
    kept quantized leaves its layer in float (logged)."""
    from .gguf import SCHEMES
    overrides: list[tuple[tuple[str, ...], GroupedWeights | None]] = []
    dequantized = set()
    for path, prefix, _ in linear_weights(cfg):
        kind = reader.tensor_type(prefix + "weight")
        if kind in SCHEMES:
            overrides.append((path, SCHEMES[kind]))
        else:
            overrides.append((path, None))
            if kind not in ("F32", "F16", "BF16", None):
                dequantized.add(kind)
    if dequantized:
        logger.warning("%s: GGUF block types %s are not kept quantized (served "
                       "types: %s); those layers are dequantized at load",
                       source, ", ".join(sorted(dequantized)),
                       ", ".join(SCHEMES))
    return QuantizationConfig("gguf", "gguf", None, tuple(overrides))


def _checked(qc: QuantizationConfig, cfg: ModelConfig, source: str
             ) -> QuantizationConfig:
    """Group sizes every quantized layer can take; fp8 on a capable device."""
    if any(isinstance(s, Fp8Weights) and s.activation != "none"
           for s in [qc.scheme] + [s for _, s in qc.overrides]):
        check_fp8_device()
    for path, _, layout in linear_weights(cfg):
        scheme = qc.method_for(path)
        if not isinstance(scheme, GroupedWeights):
            continue
        n_in = math.prod(layout.in_shape)
        g = scheme.group_size
        if g == -1:
            continue
        if g <= 0 or g % 8 or n_in % g:
            raise UnsupportedGroupSizeError(
                f"{source}: group_size={g} does not fit layer "
                f"{'/'.join(path)} ({n_in} input features): the grouped "
                "matmul takes -1 (one group per row) or a multiple of 8 "
                "dividing every layer's input features")
        if scheme.bits == 4 and n_in % 2:
            raise UnsupportedGroupSizeError(
                f"{source}: layer {'/'.join(path)} has an odd number of "
                f"input features ({n_in}); 4-bit codes pack in pairs")
    return qc
