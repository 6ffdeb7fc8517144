"""One quantized linear layer's tensors, read from an HF checkpoint (AWQ,
GPTQ, fp8) or quantized from its float weight at load (int8, fp8), into the
params of its ``LinearMethod`` (``methods.py``).

Every reader takes the layer's HF name prefix (``...q_proj.``), its
``LinearLayout`` (our out/in shapes) and a ``get(name)`` over the
checkpoint, checks each tensor's shape against the config (typed errors
naming the tensor), and returns ``{param name: np.ndarray}``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import CheckpointError, MissingWeightError, ShapeMismatchError
from ..spec import LinearLayout
from .methods import FP8_DTYPE, FP8_MAX, MIN_SCALE, Fp8Weights, GroupedWeights, Int8Weights
from .packing import AWQ_ORDER, pack_int4_pairs, unpack_words

# A checkpoint's tensor by HF name, None where it has none.
Get = Callable[[str], Any]


def _tensor(get: Get, name: str, shape: tuple[int, ...] | None,
            source: str) -> np.ndarray:
    w = get(name)
    if w is None:
        raise MissingWeightError(
            f"{source}: tensor {name!r} of the quantized checkpoint is missing")
    if shape is not None and tuple(w.shape) != tuple(shape):
        raise ShapeMismatchError(
            f"{source}: tensor {name!r} has shape {tuple(w.shape)}, but the "
            f"config and quantization_config imply {tuple(shape)}")
    return np.asarray(w)


def _dims(layout: LinearLayout) -> tuple[tuple[int, ...], int, int]:
    return tuple(layout.out_shape), math.prod(layout.out_shape), math.prod(
        layout.in_shape)


def _groups(scheme: GroupedWeights, In: int) -> int:
    return 1 if scheme.group_size == -1 else In // scheme.group_size


def _our_codes(scheme: GroupedWeights, codes_out_in: np.ndarray,
               O: tuple[int, ...]) -> np.ndarray:
    """Codes [out, In] -> our qweight [*O, In/2] (4-bit) or [*O, In]."""
    codes = codes_out_in.reshape(*O, codes_out_in.shape[-1])
    if scheme.bits == 4:
        return pack_int4_pairs(codes)
    return codes.astype(np.int8 if scheme.signed else np.uint8)


def _per_group(x: np.ndarray, O: tuple[int, ...]) -> np.ndarray:
    """[groups, out] -> [*O, groups]."""
    return np.ascontiguousarray(x.T).reshape(*O, x.shape[0])


def read_awq(scheme: GroupedWeights, get: Get, prefix: str,
             layout: LinearLayout, source: str) -> dict[str, np.ndarray]:
    """AutoAWQ GEMM tensors -> qweight, qzeros, scales."""
    O, out, In = _dims(layout)
    G = _groups(scheme, In)
    qw = _tensor(get, prefix + "qweight", (In, out // 8), source)
    qz = _tensor(get, prefix + "qzeros", (G, out // 8), source)
    s = _tensor(get, prefix + "scales", (G, out), source)
    codes = unpack_words(qw, 4, axis=1, order=AWQ_ORDER)  # [In, out]
    zeros = unpack_words(qz, 4, axis=1, order=AWQ_ORDER)  # [G, out]
    return {"qweight": _our_codes(scheme, codes.T, O),
            "scales": _per_group(s.astype(scheme.scale_dtype), O),
            "qzeros": _per_group(zeros, O)}


def read_gptq(scheme: GroupedWeights, get: Get, prefix: str,
              layout: LinearLayout, source: str,
              v2: bool = False) -> dict[str, np.ndarray]:
    """AutoGPTQ tensors -> qweight, qzeros (v1's zero - 1 undone), scales,
    and perm when the rows are in act order (desc_act)."""
    O, out, In = _dims(layout)
    G, bits = _groups(scheme, In), scheme.bits
    per = 32 // bits
    qw = _tensor(get, prefix + "qweight", (In // per, out), source)
    qz = _tensor(get, prefix + "qzeros", (G, out // per), source)
    s = _tensor(get, prefix + "scales", (G, out), source)
    codes = unpack_words(qw, bits, axis=0)  # [In, out]
    zeros = unpack_words(qz, bits, axis=1).astype(np.uint16)  # [G, out]
    if not v2:
        zeros = zeros + 1  # v1 stores zero - 1 (wrapping 0 to 2**bits - 1)
    group = In // G
    sequential = np.arange(In, dtype=np.int64) // group
    g_idx = get(prefix + "g_idx")
    out_params = {}
    if g_idx is not None:
        g_idx = _tensor(get, prefix + "g_idx", (In,), source).astype(np.int64)
    if scheme.act_order:
        if g_idx is None:
            raise MissingWeightError(
                f"{source}: tensor {prefix + 'g_idx'!r} is missing; "
                "desc_act=true checkpoints carry one per layer")
        # Sort the rows by group so each group is contiguous; the step
        # gathers the activations by the same permutation.
        perm = np.argsort(g_idx, kind="stable")
        if not np.array_equal(g_idx[perm], sequential):
            raise CheckpointError(
                f"{source}: {prefix}g_idx does not give every group "
                f"{group} rows; it is not a GPTQ act-order index")
        codes = codes[perm]
        out_params["perm"] = perm.astype(np.int32)
    elif g_idx is not None and not np.array_equal(g_idx, sequential):
        raise CheckpointError(
            f"{source}: {prefix}g_idx is not sequential but the "
            "quantize_config says desc_act=false")
    if zeros.max(initial=0) > 255:
        raise CheckpointError(f"{source}: {prefix}qzeros holds a zero point "
                              "above 255")
    out_params.update(
        qweight=_our_codes(scheme, np.ascontiguousarray(codes.T), O),
        scales=_per_group(s.astype(scheme.scale_dtype), O),
        qzeros=_per_group(zeros.astype(np.uint8), O))
    return out_params


def read_fp8(scheme: Fp8Weights, get: Get, prefix: str, layout: LinearLayout,
             source: str) -> dict[str, np.ndarray]:
    """e4m3 ``weight`` [out, in] + ``weight_scale`` (per tensor: [] or [1];
    per channel: [out] or [out, 1]) + ``input_scale`` when static."""
    O, out, In = _dims(layout)
    w = _tensor(get, prefix + "weight", (out, In), source)
    if w.dtype != np.dtype(FP8_DTYPE):
        raise CheckpointError(
            f"{source}: tensor {prefix + 'weight'!r} is {w.dtype}, not "
            "float8_e4m3fn as the fp8 quantization_config says")
    ws = _tensor(get, prefix + "weight_scale", None, source).astype(np.float32)
    if scheme.per_channel:
        if ws.size != out:
            raise ShapeMismatchError(
                f"{source}: {prefix}weight_scale has shape {ws.shape}; "
                f"per-channel scales need {out} values")
        ws = ws.reshape(O)
    else:
        if ws.size != 1:
            raise ShapeMismatchError(
                f"{source}: {prefix}weight_scale has shape {ws.shape}; "
                "per-tensor scales need one value")
        ws = ws.reshape(())
    params = {"weight": w.reshape(*O, In), "weight_scale": ws}
    if scheme.activation == "static":
        x = _tensor(get, prefix + "input_scale", None, source)
        if x.size != 1:
            raise ShapeMismatchError(
                f"{source}: {prefix}input_scale has shape {x.shape}; static "
                "activation scales are one per tensor")
        params["input_scale"] = x.astype(np.float32).reshape(())
    return params


# -- quantized at load -------------------------------------------------------
# The elementwise work runs jitted on the default device; the scales are
# divided on the host, where ``amax / qmax`` is IEEE division. XLA rewrites
# a division by a broadcast (a scalar or a per-row scale) into a multiply
# by its reciprocal, which moves some quotients by an ulp and, at a
# rounding tie, a code by one; the divisor is therefore materialized
# behind an optimization barrier (`_exact_div`), so the codes are the same
# on every platform and equal NumPy's.

@functools.partial(jax.jit, static_argnames=("per_row",))
def _amax(w: jax.Array, per_row: bool) -> jax.Array:
    return jnp.max(jnp.abs(w), axis=1) if per_row else jnp.max(jnp.abs(w))


def _exact_div(w: jax.Array, scale: jax.typing.ArrayLike) -> jax.Array:
    """w / scale elementwise in IEEE division (see above)."""
    return w / jax.lax.optimization_barrier(jnp.broadcast_to(scale, w.shape))


@jax.jit
def _int8_codes(w: jax.Array, scale: jax.typing.ArrayLike  # [out, 1]
                ) -> jax.Array:
    return jnp.clip(jnp.round(_exact_div(w, scale)), -127, 127).astype(
        jnp.int8)


@jax.jit
def _fp8_codes(w: jax.Array, scale: jax.typing.ArrayLike  # [out, 1] or []
               ) -> jax.Array:
    return jnp.clip(_exact_div(w, scale), -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)


def quantize_linear(scheme: Int8Weights | Fp8Weights, get: Get, prefix: str,
                    layout: LinearLayout, source: str
                    ) -> dict[str, np.ndarray]:
    """The float ``weight`` [out, in] quantized to ``scheme``: int8 (amax /
    127 per output channel, round half to even) or fp8 (amax / 448 per
    tensor or channel)."""
    O, out, In = _dims(layout)
    w = jnp.asarray(_tensor(get, prefix + "weight", (out, In), source),
                    jnp.float32)
    if isinstance(scheme, Fp8Weights):
        amax = np.asarray(_amax(w, scheme.per_channel))
        scale = np.maximum(amax / np.float32(FP8_MAX), np.float32(MIN_SCALE))
        div = scale[:, None] if scheme.per_channel else scale
        return {"weight": np.asarray(_fp8_codes(w, div)).reshape(*O, In),
                "weight_scale": scale.reshape(O if scheme.per_channel else ())}
    amax = np.asarray(_amax(w, True))
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(1))
    return {"weight": np.asarray(_int8_codes(w, scale[:, None])).reshape(
                *O, In),
            "weight_scale": scale.reshape(O)}
