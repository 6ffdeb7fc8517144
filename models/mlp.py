"""Feed-forward blocks a decoder layer plugs in, each with its weight names.

Every MLP is a module ``Mlp(cfg, dtype, mesh=None)`` mapping [T, D] -> [T, D] and a
``weights(cfg, hf_prefix, path)`` classmethod listing its checkpoint
tensors, so a family picks one by name (``mlp_cls`` on the model) and its
weight list follows. The third kind, a mixture of experts (a router, stacked expert weights
with an ``experts`` logical axis, a grouped product), is ``moe.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from .config import ModelConfig
from .layers import GatedInput, Linear, ScaledProduct, as_array, compute_together
from .quantization import linear_method
from .spec import WeightSpec, keep_layout, linear_from_hf

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def _projection_weights(cfg: ModelConfig, hf_prefix: str, path: tuple,
                        projections: Iterable[tuple[str, int, int]]
                        ) -> Iterator[WeightSpec]:
    for name, out_dim, in_dim in projections:
        yield WeightSpec(hf_prefix + f"{name}.weight", path + (name, "kernel"),
                         (out_dim, in_dim), linear_from_hf((out_dim,), (in_dim,)))
        if cfg.mlp_bias:
            yield WeightSpec(hf_prefix + f"{name}.bias", path + (name, "bias"),
                             (out_dim,), keep_layout)


class GatedMLP(nn.Module):
    """act(x W_gate) * (x W_up) W_down (Llama's SwiGLU, GeGLU)."""
    cfg: ModelConfig
    dtype: jnp.dtype
    mesh: Any = None  # the tensor-parallel mesh (unused: GSPMD splits F)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        D, F = c.hidden_size, c.intermediate_size
        # With fp8 per-token layers and a gated kernel, gate and up come
        # back as products before their scales and the down projection
        # quantizes act(gate) * up in one pass (Fp8Weights.apply_gated);
        # otherwise they are arrays (on the int4 kernel, both from one call:
        # compute_together).
        gate = Linear((D,), (F,), ("embed", "mlp"), c.mlp_bias, self.dtype,
                      linear_method(c), name="gate_proj")(x, scaled=True,
                                                          pending=True)
        up = Linear((D,), (F,), ("embed", "mlp"), c.mlp_bias, self.dtype,
                    linear_method(c), name="up_proj")(x, scaled=True,
                                                      pending=True)
        gate, up = compute_together(gate, up)
        act = ACTIVATIONS[c.hidden_act]
        h: GatedInput | jax.Array
        if isinstance(gate, ScaledProduct) and isinstance(up, ScaledProduct):
            h = GatedInput(gate, up, act, c.hidden_act)
        else:
            h = act(as_array(gate)) * as_array(up)
        return Linear((F,), (D,), ("mlp", "embed"), c.mlp_bias, self.dtype,
                      linear_method(c), name="down_proj")(h)

    @staticmethod
    def weights(cfg: ModelConfig, hf_prefix: str, path: tuple
                ) -> Iterator[WeightSpec]:
        D, F = cfg.hidden_size, cfg.intermediate_size
        return _projection_weights(cfg, hf_prefix, path, (
            ("gate_proj", F, D), ("up_proj", F, D), ("down_proj", D, F)))


class DenseMLP(nn.Module):
    """act(x W_up) W_down (GPT-2, Phi, StarCoder style)."""
    cfg: ModelConfig
    dtype: jnp.dtype
    mesh: Any = None  # the tensor-parallel mesh (unused: GSPMD splits F)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        D, F = c.hidden_size, c.intermediate_size
        h = Linear((D,), (F,), ("embed", "mlp"), c.mlp_bias, self.dtype,
                   linear_method(c), name="up_proj")(x)
        return Linear((F,), (D,), ("mlp", "embed"), c.mlp_bias, self.dtype,
                      linear_method(c),
                      name="down_proj")(ACTIVATIONS[c.hidden_act](h))

    @staticmethod
    def weights(cfg: ModelConfig, hf_prefix: str, path: tuple
                ) -> Iterator[WeightSpec]:
        D, F = cfg.hidden_size, cfg.intermediate_size
        return _projection_weights(cfg, hf_prefix, path, (
            ("up_proj", F, D), ("down_proj", D, F)))
