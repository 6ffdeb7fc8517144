"""`QuantizationConfig`: which quantized method each linear layer of a model
uses, and how its tensors are stored in the checkpoint.

Made once per model by ``resolve.py`` from vLLM's ``quantization`` argument
and the checkpoint's own ``quantization_config`` (or GGUF tensor types);
carried on ``ModelConfig.quantization``, so the layers create quantized
params and the loaders read the matching tensors. Frozen and hashable like
the rest of the model config; ``to_json`` / ``from_json`` write it into the
config.json of a converted (orbax) model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import UnknownQuantizationError
from .methods import Fp8Weights, GroupedWeights, Int8Weights, QuantizedLinear

# A linear layer's method (None: unquantized).
Scheme = Int8Weights | Fp8Weights | GroupedWeights | None

# vLLM's names jaxinfer serves, and the spellings it takes for them.
METHODS = ("awq", "gptq", "fp8", "int8", "gguf", "compressed-tensors")
ALIASES = {
    "awq_marlin": "awq",  # vLLM's faster AWQ kernel: the same checkpoints
    "gptq_marlin": "gptq",
    "tpu_int8": "int8",  # vLLM's int8 weight-only, quantized at load
}
# vLLM 0.11's other methods: named so the error says they exist but are
# not served here (rather than "unknown").
VLLM_OTHER_METHODS = (
    "bitsandbytes", "deepspeedfp", "ptpc_fp8", "fbgemm_fp8", "modelopt",
    "modelopt_fp4", "bitblas", "gptq_marlin_24", "gptq_bitblas", "marlin",
    "hqq", "experts_int8", "ipex", "quark", "moe_wna16", "torchao",
    "auto-round", "rtn", "inc", "mxfp4", "petit_nvfp4", "aqlm", "qqq",
    "fp_quant", "awq_triton")

# How the checkpoint stores a quantized layer's tensors.
CHECKPOINT_FORMATS = (
    "float",  # unquantized weights, quantized at load (int8, fp8)
    "awq",  # AutoAWQ GEMM: qweight [in, out/8], qzeros, scales
    "gptq",  # AutoGPTQ v1: qweight [in*bits/32, out], qzeros (zero - 1), scales, g_idx
    "gptq_v2",  # the same with zeros stored as they are
    "fp8",  # e4m3 weight + weight_scale (+ input_scale): vLLM / compressed-tensors
    "gguf",  # llama.cpp blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
    "jaxinfer",  # our own param layout (an orbax checkpoint of `jaxinfer convert`)
)

SCHEMES = {"int8": Int8Weights, "fp8": Fp8Weights, "grouped": GroupedWeights}


def normalize_method(name: str) -> str:
    """vLLM's spelling -> the method served; an unknown or unserved name is
    an UnknownQuantizationError listing what is."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key in METHODS:
        return key
    served = ", ".join(METHODS + tuple(ALIASES))
    if key in VLLM_OTHER_METHODS:
        raise UnknownQuantizationError(
            f"quantization={name!r}: jaxinfer does not serve vLLM's {name!r} "
            f"method; it serves {served} (or leave quantization unset)")
    raise UnknownQuantizationError(
        f"quantization={name!r} is not a quantization method; jaxinfer "
        f"serves {served} (or leave quantization unset)")


@dataclasses.dataclass(frozen=True)
class QuantizationConfig:
    method: str  # the vLLM name served: awq | gptq | fp8 | int8 | gguf
    checkpoint_format: str  # one of CHECKPOINT_FORMATS
    scheme: Any = None  # the LinearMethod of every linear layer by default
    # ((param path of a linear layer, its own method or None = unquantized), ...)
    overrides: tuple = ()

    def __post_init__(self) -> None:
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"checkpoint_format {self.checkpoint_format!r} "
                             f"is not one of {', '.join(CHECKPOINT_FORMATS)}")

    def method_for(self, path: tuple[str, ...]) -> Scheme:
        """The method of the linear layer at ``path`` (None: unquantized)."""
        for p, scheme in self.overrides:
            if p == path:
                return scheme
        return self.scheme

    def linear_method(self) -> QuantizedLinear:
        from .methods import QuantizedLinear
        return QuantizedLinear(self)

    # -- config.json of a converted model ---------------------------------

    def to_json(self) -> dict:
        """The ``quantization_config`` a converted model's config.json
        carries: the params are in our own layout from then on."""
        return {
            "quant_method": self.method,
            "checkpoint_format": "jaxinfer",
            "scheme": _scheme_json(self.scheme),
            "overrides": [["/".join(p), _scheme_json(s)]
                          for p, s in self.overrides],
        }

    @classmethod
    def from_json(cls, d: dict) -> QuantizationConfig:
        return cls(method=d["quant_method"], checkpoint_format="jaxinfer",
                   scheme=_scheme_from_json(d.get("scheme")),
                   overrides=tuple((tuple(p.split("/")), _scheme_from_json(s))
                                   for p, s in d.get("overrides", ())))


def _scheme_json(scheme: Scheme) -> dict | None:
    if scheme is None:
        return None
    kind = next(k for k, c in SCHEMES.items() if isinstance(scheme, c))
    # Which kernel multiplies is the runner's choice for its devices
    # (methods.with_int4_kernel), not part of the checkpoint's format.
    fields = {k: v for k, v in dataclasses.asdict(scheme).items()
              if k != "kernel"}
    return {"kind": kind, **fields}


def _scheme_from_json(d: dict | None) -> Scheme:
    if d is None:
        return None
    d = dict(d)
    return SCHEMES[d.pop("kind")](**d)
