"""Quantized ``LinearMethod``s: how a quantized linear layer holds its
weight and computes ``x @ W``.

Every method stores the weight output-major, ``[*out_shape, In]`` with the
input axes flattened to ``In`` (HF's own ``[out, in]`` order): the
contraction dimension is minor, which is the operand layout fp8 GEMMs need
and keeps each quantization group contiguous. The input axis keeps the
logical name of the layer's first input axis, so tensor parallelism splits
quantized weights where it splits the float ones.

- ``Int8Weights``: weight-only int8, one scale per output channel
  (vLLM's ``tpu_int8``; quantized at load).
- ``Fp8Weights``: e4m3 weights with per-tensor or per-channel scales; the
  activations are quantized to e4m3 too (dynamically per token or per
  tensor, or with a checkpoint's static ``input_scale``) so the product is
  an fp8 x fp8 dot (cuBLASLt fp8 GEMMs on Hopper).
- ``GroupedWeights``: integer codes with one scale (and an optional integer
  zero point or float offset) per group of ``group_size`` inputs: AWQ and
  GPTQ int4/int8, GGUF's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K. The product dequantizes
  in the jitted step, ``w = (q - z) * s + b``, computed in float32 (exact
  for every format: see ``dequantize_grouped``) and cast to the
  activations' dtype for the dot.

Each is a frozen dataclass (hashable: it is a field of the ``Linear``
module); ``QuantizedLinear`` picks a layer's method by its param path from
the model's ``QuantizationConfig``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ..layers import UNQUANTIZED, GatedInput, PendingProduct, ScaledProduct, param

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..layers import Linear, LinearMethod
    from .config import Scheme

# A layer's weight arrays by name (what create_weights returns).
Weights = dict[str, jax.Array]

FP8_DTYPE = jnp.float8_e4m3fn
FP8_MAX = float(jnp.finfo(FP8_DTYPE).max)  # 448
# A scale never below this: an all-zero row or token quantizes to zeros
# instead of 0/0.
MIN_SCALE = float(jnp.finfo(jnp.float32).tiny)

# How 4-bit codes packed two per byte are unpacked in the step: "shift"
# (and/shift on the uint8 bytes) or "bitcast" (a bitcast to uint4, XLA's
# own sub-byte type). Both give the same codes; benchmarks/quant_step.py
# times them.
INT4_UNPACK = "shift"
# A 4-bit layer with zero points (AWQ, GPTQ) whose scheme says
# kernel="pallas" multiplies with the Pallas kernels of
# pallas_kernels/int4_matmul.py (weights dequantized in registers; the
# Mosaic GPU kernel on Hopper where it takes the case, else the Triton one)
# for up to this many rows, and with XLA's dequantize-then-dot above: the
# kernels are far below the tensor cores' rate, where a prefill's bf16 dot
# is not.
INT4_KERNEL_MAX_ROWS = 256
# The result dtype of the fp8 x fp8 dot, before the scales are applied:
# "activations" (the layer's input dtype: bf16 in a bf16 model, half the
# bytes a float32 result makes the GEMM write and the scaling read back,
# with the same error) or "float32".
FP8_PRODUCT_DTYPE = "activations"

# The param names of the methods below: their dtypes are their own (codes,
# scales), never the model's float dtype.
PARAM_NAMES = ("weight", "weight_scale", "input_scale", "qweight", "scales",
               "qzeros", "offsets", "perm")

_ZEROS = nn.initializers.zeros
_ONES = nn.initializers.ones


def _shapes(module: Linear
            ) -> tuple[tuple[int, ...], int, tuple[str, ...], str]:
    """(out_shape, In, out_axes, in_axis) of a Linear module."""
    n_in = len(module.in_shape)
    return (tuple(module.out_shape), math.prod(module.in_shape),
            tuple(module.axes[n_in:]), module.axes[0])


def _flat_input(module: Linear, x: jax.Array) -> jax.Array:
    """x [..., *in_shape] -> [..., In]."""
    return _flat(x, module.in_shape)


def _flat(x: jax.Array, in_shape: tuple[int, ...]) -> jax.Array:
    n_in = len(in_shape)
    return x.reshape(x.shape[:x.ndim - n_in] + (math.prod(in_shape),))


def _dot_minor(x2: jax.Array, w: jax.Array, out_ndim: int,
               preferred: jax.typing.DTypeLike | None = None) -> jax.Array:
    """x2 [..., In] . w [*O, In] -> [..., *O] (contraction minor on both)."""
    return jax.lax.dot_general(
        x2, w, (((x2.ndim - 1,), (out_ndim,)), ((), ())),
        preferred_element_type=preferred)


# ------------------------------------------------------------------ int8 ---

@dataclasses.dataclass(frozen=True)
class Int8Weights:
    """Weight-only int8: ``weight`` int8 [*O, In], ``weight_scale`` f32 [*O]
    (symmetric, amax / 127 per output channel). The codes are widened to
    the activations' dtype for the dot and the scale applied to its
    output."""
    name = "int8"

    def create_weights(self, module: Linear) -> Weights:
        O, In, out_axes, in_axis = _shapes(module)
        return {
            "weight": param(module, "weight", O + (In,), out_axes + (in_axis,),
                            jnp.int8, _ZEROS),
            "weight_scale": param(module, "weight_scale", O, out_axes,
                                  jnp.float32, _ONES),
        }

    def apply(self, module: Linear, weights: Weights, x: jax.Array
              ) -> jax.Array:
        x2 = _flat_input(module, x)
        w = weights["weight"].astype(x.dtype)
        y = _dot_minor(x2, w, len(module.out_shape), jnp.float32)
        return (y * weights["weight_scale"]).astype(x.dtype)


# ------------------------------------------------------------------- fp8 ---

# "none": weight-only (compressed-tensors W8A16): the e4m3 weights are
# widened to the activations' dtype.
ACTIVATION_SCHEMES = ("per_token", "per_tensor", "static", "none")
GATED_KERNELS = ("xla", "pallas", "pallas_interpret")
# Steps of fewer rows quantize a gated input with XLA's fusions: the
# kernel's few rows per program pay off on a prefill's thousands of rows
# and cost latency on a decode step's few.
GATED_KERNEL_MIN_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """``weight`` e4m3 [*O, In] with ``weight_scale`` f32 [*O]
    (``per_channel``) or [] (per tensor); activations quantized to e4m3 with
    ``activation``: "per_token" / "per_tensor" (dynamic amax / 448),
    "static" (the checkpoint's ``input_scale``, f32 []) or "none"
    (weight-only)."""
    per_channel: bool = False
    activation: str = "per_tensor"
    # How a gated MLP's down projection quantizes its input act(gate) * up:
    # "xla" (XLA's fusions: a row reduction and a quantizing loop, each
    # reading both products), "pallas" (one pass, the Pallas kernel of
    # pallas_kernels/fp8_gated_quant.py; per-token and per-channel scales,
    # silu) or "pallas_interpret" (the same kernel interpreted: tests).
    # The runner picks "pallas" on one GPU (with_int4_kernel).
    gated_kernel: str = "xla"
    name = "fp8"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATION_SCHEMES:
            raise ValueError(f"activation must be one of "
                             f"{', '.join(ACTIVATION_SCHEMES)}, got "
                             f"{self.activation!r}")
        if self.gated_kernel not in GATED_KERNELS:
            raise ValueError(f"gated_kernel must be one of "
                             f"{', '.join(GATED_KERNELS)}, got "
                             f"{self.gated_kernel!r}")

    def _gated(self, module: Linear) -> bool:
        """Whether this layer hands on scaled products / takes gated input:
        per-token activations, per-channel weights, one output axis."""
        return (self.gated_kernel != "xla" and self.per_channel
                and self.activation == "per_token"
                and len(module.out_shape) == 1)

    def scaled_product(self, module: Linear, weights: Weights, x: jax.Array
                       ) -> ScaledProduct | None:
        """The product before its scales (`Linear(..., scaled=True)`), or
        None where this layer does not hand one on."""
        if not self._gated(module):
            return None
        x2 = _flat_input(module, x).astype(jnp.float32)
        xq, xs = quantize_activations(x2, self.activation)
        raw = _dot_minor(xq, weights["weight"], 1, _product_dtype(x.dtype))
        return ScaledProduct(raw, xs, weights["weight_scale"], x.dtype)

    def apply_gated(self, module: Linear, weights: Weights, h: GatedInput
                    ) -> jax.Array | None:
        """This layer's output for the gated input ``h``, its per-token
        codes made in one pass by the Pallas kernel; None where the kernel
        does not take the case (the caller then computes ``h``)."""
        from jaxinfer.pallas_kernels import fp8_gated_quant as fgq
        g, u = h.gate, h.up
        if (not self._gated(module) or h.act_name != "silu"
                or g.raw.ndim != 2 or not fgq.takes(g.raw.shape[-1])
                or g.raw.shape[0] < GATED_KERNEL_MIN_ROWS):
            return None
        codes, xs = fgq.silu_mul_quantize(
            g.raw, u.raw, g.row_scale, u.row_scale, g.col_scale, u.col_scale,
            interpret=self.gated_kernel == "pallas_interpret")
        y = _dot_minor(codes, weights["weight"], 1,
                       _product_dtype(g.dtype)).astype(jnp.float32)
        return (y * xs * weights["weight_scale"]).astype(g.dtype)

    def create_weights(self, module: Linear) -> Weights:
        O, In, out_axes, in_axis = _shapes(module)
        out = {
            "weight": param(module, "weight", O + (In,), out_axes + (in_axis,),
                            FP8_DTYPE, _ZEROS),
            "weight_scale": param(module, "weight_scale",
                                  O if self.per_channel else (),
                                  out_axes if self.per_channel else (),
                                  jnp.float32, _ONES),
        }
        if self.activation == "static":
            out["input_scale"] = param(module, "input_scale", (), (),
                                       jnp.float32, _ONES)
        return out

    def apply(self, module: Linear, weights: Weights, x: jax.Array
              ) -> jax.Array:
        n_out = len(module.out_shape)
        if self.activation == "none":
            y = _dot_minor(_flat_input(module, x),
                           weights["weight"].astype(x.dtype), n_out,
                           jnp.float32)
            return (y * weights["weight_scale"]).astype(x.dtype)
        x2 = _flat_input(module, x).astype(jnp.float32)
        xq, xs = quantize_activations(x2, self.activation,
                                      weights.get("input_scale"))
        y = _dot_minor(xq, weights["weight"], n_out,
                       _product_dtype(x.dtype)).astype(jnp.float32)
        # Per-token scales [..., 1] broadcast over every output axis.
        xs = xs.reshape(xs.shape + (1,) * (n_out - 1))
        return (y * xs * weights["weight_scale"]).astype(x.dtype)


def _product_dtype(activations_dtype: jax.typing.DTypeLike
                   ) -> jax.typing.DTypeLike:
    """The fp8 dot's result dtype (FP8_PRODUCT_DTYPE)."""
    return (activations_dtype if FP8_PRODUCT_DTYPE == "activations"
            else jnp.dtype(FP8_PRODUCT_DTYPE))


def quantize_activations(x2: jax.Array, activation: str,
                         input_scale: jax.Array | None = None
                         ) -> tuple[jax.Array, jax.Array]:
    """x2 [..., In] f32 -> (e4m3 codes, scale [..., 1] or []) with
    x ~= codes * scale."""
    if activation == "static":
        scale = jnp.asarray(input_scale, jnp.float32)
    elif activation == "per_token":
        scale = jnp.max(jnp.abs(x2), axis=-1, keepdims=True) / FP8_MAX
    else:
        scale = jnp.max(jnp.abs(x2)) / FP8_MAX
    scale = jnp.maximum(scale, MIN_SCALE)
    codes = jnp.clip(x2 / scale, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)
    return codes, scale


# --------------------------------------------------------------- grouped ---

@dataclasses.dataclass(frozen=True)
class GroupedWeights:
    """Integer codes with per-group scales along the input axis:
    ``w[o, i] = (q[o, i] - z[o, g]) * s[o, g] + b[o, g]``, ``g = i //
    group_size``.

    Params: ``qweight`` (4-bit: uint8 [*O, In / 2], input ``2j`` in the low
    nibble of byte ``j``, ``2j + 1`` in the high one; 8-bit: int8 or uint8
    [*O, In]); ``scales`` [*O, G] in ``scale_dtype``; ``qzeros`` uint8
    [*O, G] when ``zeros``, else the constant ``zero`` is subtracted;
    ``offsets`` [*O, G] in ``scale_dtype`` when ``offsets``; ``perm`` int32
    [In] when ``act_order`` (GPTQ's desc_act: the rows were sorted by group
    at load, so the step gathers the activations in the same order)."""
    bits: int  # 4 or 8
    group_size: int  # inputs per group; the whole input when -1 was asked
    signed: bool = False  # 8-bit codes are int8 (else uint8)
    zeros: bool = False
    zero: int = 0
    offsets: bool = False
    scale_dtype: str = "float16"
    act_order: bool = False
    # "xla": codes dequantized by XLA ops feeding an XLA dot; "pallas": the
    # int4 kernel where it applies (4-bit codes with zero points, decode-
    # sized batches). The runner picks "pallas" on one GPU
    # (with_int4_kernel); a field, so a program traced with one is never
    # reused for the other.
    kernel: str = "xla"
    name = "grouped"

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits}")
        if self.signed and self.bits != 8:
            raise ValueError("signed codes are 8-bit")
        if self.kernel not in ("xla", "pallas"):
            raise ValueError(f"kernel must be 'xla' or 'pallas', got "
                             f"{self.kernel!r}")

    def code_dtype(self) -> jax.typing.DTypeLike:
        return jnp.int8 if self.signed else jnp.uint8

    def create_weights(self, module: Linear) -> Weights:
        O, In, out_axes, in_axis = _shapes(module)
        G = 1 if self.group_size == -1 else In // self.group_size
        packed = In // 2 if self.bits == 4 else In
        sdt = jnp.dtype(self.scale_dtype)
        out = {
            "qweight": param(module, "qweight", O + (packed,),
                             out_axes + (in_axis,), self.code_dtype(), _ZEROS),
            "scales": param(module, "scales", O + (G,), out_axes + (in_axis,),
                            sdt, _ONES),
        }
        if self.zeros:
            out["qzeros"] = param(module, "qzeros", O + (G,),
                                  out_axes + (in_axis,), jnp.uint8, _ZEROS)
        if self.offsets:
            out["offsets"] = param(module, "offsets", O + (G,),
                                   out_axes + (in_axis,), sdt, _ZEROS)
        if self.act_order:
            # A name no partition rule maps: replicated.
            out["perm"] = param(module, "perm", (In,), ("quant_perm",),
                                jnp.int32, _ZEROS)
        return out

    def apply(self, module: Linear, weights: Weights, x: jax.Array
              ) -> jax.Array:
        x2 = _flat_input(module, x)
        if self.act_order:
            x2 = jnp.take(x2, weights["perm"], axis=-1)
        if self._on_kernel(x2, weights):
            return _int4_kernel(x2, weights, module.out_shape)
        w = dequantize_grouped(self, weights).astype(x.dtype)
        return _dot_minor(x2, w, len(module.out_shape))

    def pending_product(self, module: Linear, weights: Weights, x: jax.Array
                        ) -> PendingProduct | None:
        """The product left for ``compute_together`` when it would run on
        the int4 kernel (so that q, k and v, or gate and up, share one
        call); None otherwise."""
        # act_order gathers each layer's input in its own order: no sharing.
        if self.act_order or not self._on_kernel(_flat_input(module, x),
                                                 weights):
            return None
        return PendingProduct(x, weights, module.in_shape, module.out_shape,
                              _int4_kernel_together)

    def _on_kernel(self, x2: jax.Array, weights: Weights) -> bool:
        """Whether this product of x2 [..., In] runs on the int4 kernel."""
        return (self.kernel == "pallas"
                and math.prod(x2.shape[:-1]) <= INT4_KERNEL_MAX_ROWS
                and self._kernel_takes(weights))

    def _kernel_takes(self, weights: Weights) -> bool:
        if not (self.bits == 4 and self.zeros and not self.offsets
                and weights["qweight"].dtype == jnp.uint8):
            return False
        from jaxinfer.pallas_kernels.int4_matmul import takes
        q, s = weights["qweight"], weights["scales"]
        n_out = math.prod(q.shape[:-1])
        return takes(2 * q.shape[-1], n_out, s.shape[-1])


def _weight_set(weights: Weights, out_shape: tuple[int, ...]
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A layer's (qweight, scales, qzeros) as the int4 kernel takes them:
    [Out, In / 2], [Out, G], [Out, G]."""
    n_out = math.prod(out_shape)
    return (weights["qweight"].reshape(n_out, -1),
            weights["scales"].reshape(n_out, -1),
            weights["qzeros"].reshape(n_out, -1))


def _int4_kernel(x2: jax.Array, weights: Weights, out_shape: tuple[int, ...]
                 ) -> jax.Array:
    """x2 [..., In] times one layer on the int4 kernel. No tuning: the
    Mosaic GPU kernel on Hopper where it takes the case
    (int4_matmul.uses_mosaic), else the Triton kernel's default tuning."""
    from jaxinfer.pallas_kernels.int4_matmul import int4_matmul
    y = int4_matmul(x2.reshape(-1, x2.shape[-1]),
                    *_weight_set(weights, out_shape),
                    interpret=jax.default_backend() == "cpu")
    return y.reshape(x2.shape[:-1] + tuple(out_shape))


def _int4_kernel_together(products: list[PendingProduct]) -> list[jax.Array]:
    """Pending int4 products of one input (``compute_together``): one
    Mosaic call for them all where it takes them (``int4_matmul_many``)."""
    from jaxinfer.pallas_kernels.int4_matmul import int4_matmul_many
    p0 = products[0]
    x2 = _flat(p0.x, p0.in_shape)
    ys = int4_matmul_many(x2.reshape(-1, x2.shape[-1]),
                          [_weight_set(p.weights, p.out_shape)
                           for p in products],
                          interpret=jax.default_backend() == "cpu")
    return [y.reshape(x2.shape[:-1] + tuple(p.out_shape))
            for y, p in zip(ys, products)]


def unpack_int4(packed: jax.Array, method: str | None = None) -> jax.Array:
    """uint8 [..., n] -> uint8 codes [..., 2n] (low nibble first)."""
    method = method or INT4_UNPACK
    if method == "bitcast":
        codes = jax.lax.bitcast_convert_type(packed, jnp.uint4)
        return codes.reshape(packed.shape[:-1] + (2 * packed.shape[-1],)
                             ).astype(jnp.uint8)
    pairs = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
    return pairs.reshape(packed.shape[:-1] + (2 * packed.shape[-1],))


def grouped_codes(scheme: GroupedWeights, qweight: jax.Array,
                  unpack: str | None = None) -> jax.Array:
    """The integer codes [*O, In] of ``qweight`` (a uint4 array is already
    its codes, in XLA's own sub-byte storage)."""
    if scheme.bits == 4 and qweight.dtype != jnp.uint4:
        return unpack_int4(qweight, unpack)
    return qweight


def dequantize_grouped(scheme: GroupedWeights, weights: dict[str, Any],
                       unpack: str | None = None) -> jax.Array:
    """[*O, In] float32 weights. Exact in float32 for every format served:
    ``q - z`` is a small integer, and its product with an f16 scale (or
    GGUF's f32 ``d * sc``) keeps under 24 significant bits; GGUF's own
    dequantizers compute the same expressions in the same order."""
    q = grouped_codes(scheme, weights["qweight"], unpack)
    *O, In = q.shape
    s = weights["scales"]
    G = s.shape[-1]
    q = q.reshape(*O, G, In // G).astype(jnp.int32)
    if scheme.zeros:
        q = q - weights["qzeros"].astype(jnp.int32)[..., None]
    elif scheme.zero:
        q = q - scheme.zero
    w = q.astype(jnp.float32) * s.astype(jnp.float32)[..., None]
    if scheme.offsets:
        w = w + weights["offsets"].astype(jnp.float32)[..., None]
    return w.reshape(*O, In)


# ------------------------------------------------------------- dispatch ---

@dataclasses.dataclass(frozen=True)
class QuantizedLinear:
    """The ``LinearMethod`` of every linear layer of a quantized model: the
    layer's own method, looked up by its param path (a layer the checkpoint
    left unquantized keeps the plain product)."""
    config: Any  # QuantizationConfig

    def _method(self, module: Linear) -> LinearMethod:
        return self.config.method_for(tuple(module.path)) or UNQUANTIZED

    def method_of(self, module: Linear) -> LinearMethod:
        """The method of ``module`` (Linear.__call__'s fused paths)."""
        return self._method(module)

    def create_weights(self, module: Linear) -> Weights:
        return self._method(module).create_weights(module)

    def apply(self, module: Linear, weights: Weights, x: jax.Array
              ) -> jax.Array:
        return self._method(module).apply(module, weights, x)


def with_int4_kernel(cfg: ModelConfig, devices_per_replica: int,
                     platform: str) -> ModelConfig:
    """``cfg`` with its 4-bit zero-point schemes on the Pallas int4 kernel,
    and its per-token fp8 schemes' gated MLP input on the Pallas quantizer
    (`Fp8Weights.gated_kernel`), when the model runs on one GPU; as it is
    otherwise (CPU: the kernel
    would be interpreted; several devices: XLA's partitioner cannot split
    a custom kernel, so the sharded layers keep XLA's product)."""
    q = getattr(cfg, "quantization", None)
    if q is None or platform != "gpu" or devices_per_replica != 1:
        return cfg

    def on_kernel(scheme: Scheme) -> Scheme:
        if (isinstance(scheme, GroupedWeights) and scheme.bits == 4
                and scheme.zeros and not scheme.offsets):
            return dataclasses.replace(scheme, kernel="pallas")
        if (isinstance(scheme, Fp8Weights) and scheme.per_channel
                and scheme.activation == "per_token"):
            return dataclasses.replace(scheme, gated_kernel="pallas")
        return scheme
    q = dataclasses.replace(q, scheme=on_kernel(q.scheme), overrides=tuple(
        (path, on_kernel(m)) for path, m in q.overrides))
    return dataclasses.replace(cfg, quantization=q)
