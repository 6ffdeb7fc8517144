"""Building blocks shared by model families: the RMSNorms and the linear layer.

``Linear`` is the one place where a weight matrix is created and multiplied,
through a ``LinearMethod`` (vLLM's seam): today the plain product; a
quantized method would create packed integer weights plus scales and apply
its own product, without any layer changing. LoRA adapters are added
around whatever method a Linear has (``lora.py``), not in place of it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol, overload

import jax
import jax.numpy as jnp
from flax import linen as nn

from .lora import has_lora, lora_delta

# Rows of x for which CPU logits against a [V, D] table are a multiply and a
# sum rather than a matmul (`rows_times_table`): the range where it was
# measured faster.
CPU_REDUCTION_ROWS = (2, 32)


def rows_times_table(x: jax.Array,  # [S, D]
                     table: jax.Array,  # [V, D]
                     ) -> jax.Array:  # [S, V]
    """``x @ table.T`` for x [S, D] and a [V, D] table (tied embeddings).

    On CPU, for 2-32 float32 rows (decode batches), it is computed as a
    multiply and a sum over D into [V, S], then transposed: each table row
    is read once, in order, and used for every x row. XLA CPU's matmul for
    so few rows reads the table at about half that rate. One row stays a
    matmul (XLA's matrix-vector product, far faster there than the
    reduction), and so do larger batches and other dtypes."""
    rows = x.shape[0]
    if not (CPU_REDUCTION_ROWS[0] <= rows <= CPU_REDUCTION_ROWS[1]
            and x.dtype == table.dtype == jnp.float32):
        return x @ table.T
    return jax.lax.platform_dependent(
        x, table,
        cpu=lambda x, t: jnp.sum(t[:, None, :] * x[None, :, :], axis=-1).T,
        default=lambda x, t: x @ t.T)


def param(module: nn.Module, name: str, shape: tuple[int, ...],
          axes: tuple[str, ...], dtype: jax.typing.DTypeLike,
          init: Any = nn.initializers.normal(0.02)) -> jax.Array:
    """A param of ``module`` carrying its logical axis names (sharding/)."""
    # flax's stub types the boxed value; Module.param unboxes it (unbox=True).
    return module.param(  # type: ignore[return-value]
        name, nn.with_logical_partitioning(init, axes), shape, dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32; HF casts back to the
    activation dtype before the weight multiply."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return scale * xf.astype(x.dtype)


class RMSNorm(nn.Module):
    """``scale`` is readable without applying the norm (a kernel that fuses
    the norm takes the weight itself)."""
    dim: int
    eps: float
    dtype: jnp.dtype

    def setup(self) -> None:
        self.scale = param(self, "scale", (self.dim,), ("norm",), self.dtype,
                           nn.initializers.ones)

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale, self.eps)


class UnitOffsetRMSNorm(nn.Module):
    """RMSNorm whose stored weight is an offset from one: ``x * (1 + w)``
    (Gemma's convention; its checkpoints hold ``w`` initialised to zeros).
    The product is taken in float32 before the cast back, as HF's Gemma
    norms do (Llama's casts first)."""
    dim: int
    eps: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = param(self, "scale", (self.dim,), ("norm",), self.dtype,
                      nn.initializers.zeros)
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) +
                                self.eps)
        return (xf * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)


class LinearMethod(Protocol):
    """How a ``Linear`` holds and applies its weight. Hashable (a module
    field): a frozen dataclass of its static settings."""

    def create_weights(self, module: Linear) -> Any:
        """Declares the weight params on ``module`` (``param``), returns
        whatever ``apply`` needs (an array, or packed data and scales)."""

    def apply(self, module: Linear, weights: Any, x: jax.Array) -> jax.Array:
        """x [..., *in_shape] -> [..., *out_shape]."""


@dataclasses.dataclass(frozen=True)
class ScaledProduct:
    """A product handed on before its scales (``Linear(..., scaled=True)``
    with a method that offers one): ``raw`` [T, O] in the activations'
    dtype, ``row_scale`` [T, 1] and ``col_scale`` [O] float32;
    ``value()`` is the layer's output."""
    raw: jax.Array
    row_scale: jax.Array
    col_scale: jax.Array
    dtype: Any

    def value(self) -> jax.Array:
        return (self.raw.astype(jnp.float32) * self.row_scale
                * self.col_scale).astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class GatedInput:
    """``act(gate) * up`` (a gated MLP's hidden state) kept as its two
    scaled products, so that the next layer's method may quantize it in
    one pass (``apply_gated``); ``value()`` computes it as XLA ops."""
    gate: ScaledProduct
    up: ScaledProduct
    act: Any  # the activation function
    act_name: str  # its config name ("silu", ...)

    def value(self) -> jax.Array:
        return self.act(self.gate.value()) * self.up.value()


@dataclasses.dataclass(frozen=True)
class PendingProduct:
    """A layer's product left for ``compute_together`` (``Linear(...,
    pending=True)`` with a method that offers one), so that layers reading
    the same input (q, k and v; gate and up) can run as one kernel call.
    ``run(products) -> outputs`` computes a list of pending products that
    share ``run`` and ``x``."""
    x: jax.Array  # the layer's input, as given (its identity groups)
    weights: Any
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    run: Any
    bias: Any = None  # added to the product by compute_together


def compute_together(*ys: Any) -> list[Any]:
    """The outputs of ``Linear(..., pending=True)`` calls with each pending
    product computed: those that share one input and one ``run`` in one
    call. Anything else (an array, a ``ScaledProduct``) passes through."""
    out = list(ys)
    groups: dict[tuple[int, Any], list[int]] = {}
    for i, y in enumerate(ys):
        if isinstance(y, PendingProduct):
            groups.setdefault((id(y.x), y.run), []).append(i)
    for idx in groups.values():
        for i, r in zip(idx, ys[idx[0]].run([ys[i] for i in idx])):
            out[i] = r if ys[i].bias is None else r + ys[i].bias
    return out


def as_array(x: jax.Array | ScaledProduct | GatedInput) -> jax.Array:
    """A layer output as an array (a ScaledProduct's value)."""
    return x.value() if isinstance(x, (ScaledProduct, GatedInput)) else x


@dataclasses.dataclass(frozen=True)
class UnquantizedLinear:
    """The weight is one ``kernel`` of shape in_shape + out_shape in the
    model's dtype; the product is a dot_general over the input axes."""

    def create_weights(self, module: Linear) -> jax.Array:
        return param(module, "kernel", module.in_shape + module.out_shape,
                     module.axes, module.dtype)

    def apply(self, module: Linear, weights: jax.Array, x: jax.Array
              ) -> jax.Array:
        n_in = len(module.in_shape)
        x_axes = tuple(range(x.ndim - n_in, x.ndim))
        return jax.lax.dot_general(x, weights,
                                   ((x_axes, tuple(range(n_in))), ((), ())))


UNQUANTIZED = UnquantizedLinear()


class Linear(nn.Module):
    """x @ W (+ b) with W of shape in_shape + out_shape (DenseGeneral-like,
    but with named logical axes and HF-compatible layout)."""
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    axes: tuple[str, ...]  # logical names of in_shape + out_shape
    use_bias: bool
    dtype: jnp.dtype
    method: LinearMethod = UNQUANTIZED  # how the weight is held and applied

    @overload
    def __call__(self, x: jax.Array | GatedInput, *,
                 scaled: Literal[False] = False,
                 pending: Literal[False] = False) -> jax.Array: ...

    @overload
    def __call__(self, x: jax.Array | GatedInput, *, scaled: bool = False,
                 pending: bool = False
                 ) -> jax.Array | ScaledProduct | PendingProduct: ...

    @nn.compact
    def __call__(self, x: jax.Array | GatedInput, *, scaled: bool = False,
                 pending: bool = False
                 ) -> jax.Array | ScaledProduct | PendingProduct:
        """x [..., *in_shape] (or a ``GatedInput``) -> [..., *out_shape].
        ``scaled``: return a ``ScaledProduct`` when the layer's method
        offers one (fp8 with per-token and per-channel scales and a gated
        kernel) and the layer adds nothing after the product (no bias, no
        adapter); ``pending``: a ``PendingProduct`` when the method offers
        one (the int4 kernel's layers, for ``compute_together``, which adds
        the bias) and the layer has no adapter; an array otherwise."""
        weights = self.method.create_weights(self)
        # The method of this layer (a checkpoint's QuantizedLinear picks one
        # per param path).
        resolved = getattr(self.method, "method_of", lambda m: self.method)(self)
        plain = not self.use_bias and not has_lora(self)
        if isinstance(x, GatedInput):
            y = (resolved.apply_gated(self, weights, x)
                 if plain and hasattr(resolved, "apply_gated") else None)
            if y is not None:
                return y
            x = x.value()
        if scaled and plain and hasattr(resolved, "scaled_product"):
            y = resolved.scaled_product(self, weights, x)
            if y is not None:
                return y
        if pending and not has_lora(self) and hasattr(resolved,
                                                      "pending_product"):
            y = resolved.pending_product(self, weights, x)
            if y is not None:
                if self.use_bias:
                    y = dataclasses.replace(y, bias=self._bias())
                return y
        y = self.method.apply(self, weights, x)
        if has_lora(self):  # adapters for this layer in the step (lora.py)
            y = y + lora_delta(self, x).astype(y.dtype)
        if self.use_bias:
            y = y + self._bias()
        return y

    def _bias(self) -> jax.Array:
        return param(self, "bias", self.out_shape,
                     self.axes[len(self.in_shape):], self.dtype,
                     nn.initializers.zeros)
