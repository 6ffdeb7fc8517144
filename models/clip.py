"""CLIP's vision tower (a pre-layernorm ViT) in Flax linen, as LLaVA uses it.

Patches -> class token + patch embeddings + learned position embeddings ->
``pre_layrnorm`` -> encoder layers (pre-norm attention and MLP blocks). The
tower returns the hidden states of the layers a model asks for
(``feature_layers``, HF's ``hidden_states`` numbering: 0 is the embedding
output, i the output of layer i), and builds only the layers up to the
deepest of them: LLaVA reads layer -2, so the last layer and
``post_layernorm`` are never computed, nor loaded.

The patch embedding is HF's stride-p convolution written as what it is, a
matmul over non-overlapping p x p patches, so the kernel is one
``[C * p * p, D]`` matrix (the conv weight flattened).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from .errors import ModelConfigError
from .layers import Linear, param
from .mlp import ACTIVATIONS
from .spec import WeightSpec, keep_layout, linear_from_hf, reshape_to

VISION_ACTIVATIONS = {
    **ACTIVATIONS,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """HF's CLIPVisionConfig fields the tower reads."""
    hidden_size: int  # Dv
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # square input, pixels
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ModelConfigError(
                f"vision_config image_size ({self.image_size}) must be a "
                f"multiple of patch_size ({self.patch_size})")
        if self.hidden_size % self.num_heads:
            raise ModelConfigError(
                f"vision_config hidden_size ({self.hidden_size}) must be a "
                f"multiple of num_attention_heads ({self.num_heads})")
        if self.hidden_act not in VISION_ACTIVATIONS:
            raise ModelConfigError(
                f"vision_config hidden_act {self.hidden_act!r} is not "
                f"supported; supported: {', '.join(VISION_ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def patch_dim(self) -> int:
        return self.num_channels * self.patch_size ** 2


def vision_config_from_hf(hf: dict[str, Any]) -> VisionConfig:
    """A complete HF ``vision_config`` dict (defaults filled in)."""
    model_type = hf.get("model_type", "clip_vision_model")
    if model_type != "clip_vision_model":
        raise ModelConfigError(
            f"vision tower {model_type!r} is not supported; supported: "
            "clip_vision_model")
    return VisionConfig(
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=int(hf["num_attention_heads"]),
        image_size=int(hf["image_size"]),
        patch_size=int(hf["patch_size"]),
        num_channels=int(hf.get("num_channels", 3)),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        hidden_act=hf.get("hidden_act", "quick_gelu"))


def hidden_state_indices(layers: Sequence[int], num_layers: int
                         ) -> tuple[int, ...]:
    """HF ``hidden_states`` indices (negative ones counted from the end of
    the num_layers + 1 states) as non-negative ones."""
    out = []
    for i in layers:
        j = i + num_layers + 1 if i < 0 else i
        if not 0 <= j <= num_layers:
            raise ModelConfigError(
                f"vision_feature_layer {i} is outside the tower's "
                f"{num_layers + 1} hidden states")
        out.append(j)
    return tuple(out)


class LayerNorm(nn.Module):
    """torch's LayerNorm (scale and bias), computed in float32."""
    dim: int
    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = param(self, "scale", (self.dim,), ("norm",), self.dtype,
                      nn.initializers.ones)
        bias = param(self, "bias", (self.dim,), ("norm",), self.dtype,
                     nn.initializers.zeros)
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
                ).astype(x.dtype)


class VisionAttention(nn.Module):
    cfg: VisionConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [B, T, Dv]
        c = self.cfg
        D, N, H = c.hidden_size, c.num_heads, c.head_dim
        proj = {name: Linear((D,), (N, H), ("embed", "heads", "head_dim"),
                             True, self.dtype, name=name)(x)
                for name in ("q_proj", "k_proj", "v_proj")}
        # Full (non-causal) attention over the image's tokens; softmax in
        # float32 whatever the activation dtype.
        out = jax.nn.dot_product_attention(proj["q_proj"], proj["k_proj"],
                                           proj["v_proj"], scale=H ** -0.5)
        return Linear((N, H), (D,), ("heads", "head_dim", "embed"), True,
                      self.dtype, name="out_proj")(out)


class VisionMLP(nn.Module):
    cfg: VisionConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        h = Linear((c.hidden_size,), (c.intermediate_size,), ("embed", "mlp"),
                   True, self.dtype, name="fc1")(x)
        h = VISION_ACTIVATIONS[c.hidden_act](h)
        return Linear((c.intermediate_size,), (c.hidden_size,),
                      ("mlp", "embed"), True, self.dtype, name="fc2")(h)


class VisionEncoderLayer(nn.Module):
    cfg: VisionConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        h = LayerNorm(c.hidden_size, c.layer_norm_eps, self.dtype,
                      name="layer_norm1")(x)
        x = x + VisionAttention(c, self.dtype, name="self_attn")(h)
        h = LayerNorm(c.hidden_size, c.layer_norm_eps, self.dtype,
                      name="layer_norm2")(x)
        return x + VisionMLP(c, self.dtype, name="mlp")(h)


class CLIPVisionTower(nn.Module):
    """pixel_values [B, C, S, S] -> the hidden states [B, 1 + patches, Dv]
    at ``feature_layers`` (non-negative HF indices), in that order."""
    cfg: VisionConfig
    dtype: Any
    feature_layers: tuple[int, ...]

    @nn.compact
    def __call__(self, pixel_values: jax.Array) -> list[jax.Array]:
        c = self.cfg
        B, C, S, _ = pixel_values.shape
        p, g = c.patch_size, c.image_size // c.patch_size
        if (C, S) != (c.num_channels, c.image_size) or pixel_values.shape[3] != S:
            raise ValueError(
                f"pixel_values {pixel_values.shape} do not match the tower's "
                f"{c.num_channels} x {c.image_size} x {c.image_size}")
        # [B, C, g, p, g, p] -> [B, g * g, C * p * p]: patches in row-major
        # order, each flattened channel-first as the conv weight is.
        patches = pixel_values.reshape(B, C, g, p, g, p).transpose(
            0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p).astype(self.dtype)
        kernel = param(self, "patch_embedding", (c.patch_dim, c.hidden_size),
                       ("patch", "embed"), self.dtype)
        cls = param(self, "class_embedding", (c.hidden_size,), ("embed",),
                    self.dtype)
        pos = param(self, "position_embedding",
                    (c.num_patches + 1, c.hidden_size), ("patch", "embed"),
                    self.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls, (B, 1, c.hidden_size)),
                             patches @ kernel], axis=1) + pos[None]
        x = LayerNorm(c.hidden_size, c.layer_norm_eps, self.dtype,
                      name="pre_layrnorm")(x)
        states = [x]
        for i in range(max(self.feature_layers)):
            x = VisionEncoderLayer(c, self.dtype, name=f"layers_{i}")(x)
            states.append(x)
        return [states[i] for i in self.feature_layers]


# -- checkpoint names -------------------------------------------------------

def _linear(hf: str, path: tuple, out_dim: int, in_dim: int,
            out_shape: tuple, in_shape: tuple) -> Iterator[WeightSpec]:
    yield WeightSpec(hf + ".weight", path + ("kernel",), (out_dim, in_dim),
                     linear_from_hf(out_shape, in_shape))
    yield WeightSpec(hf + ".bias", path + ("bias",), (out_dim,),
                     reshape_to(out_shape))


def _norm(hf: str, path: tuple, dim: int) -> Iterator[WeightSpec]:
    yield WeightSpec(hf + ".weight", path + ("scale",), (dim,))
    yield WeightSpec(hf + ".bias", path + ("bias",), (dim,))


def vision_tower_weights(c: VisionConfig, num_layers: int
                         ) -> Iterator[WeightSpec]:
    """HF's CLIPVisionModel tensors (names as transformers 5 writes them,
    without the ``vision_model.`` prefix) of the embeddings and the first
    ``num_layers`` layers: the ones the tower computes."""
    D, F, N, H = c.hidden_size, c.intermediate_size, c.num_heads, c.head_dim
    yield WeightSpec(
        "embeddings.patch_embedding.weight", ("patch_embedding",),
        (D, c.num_channels, c.patch_size, c.patch_size),
        lambda w: w.reshape(w.shape[0], -1).T)
    yield WeightSpec("embeddings.class_embedding", ("class_embedding",), (D,),
                     keep_layout)
    yield WeightSpec("embeddings.position_embedding.weight",
                     ("position_embedding",), (c.num_patches + 1, D))
    yield from _norm("pre_layrnorm", ("pre_layrnorm",), D)
    for i in range(num_layers):
        hf, p = f"encoder.layers.{i}.", (f"layers_{i}",)
        for name in ("q_proj", "k_proj", "v_proj"):
            yield from _linear(hf + f"self_attn.{name}", p + ("self_attn", name),
                               D, D, (N, H), (D,))
        yield from _linear(hf + "self_attn.out_proj",
                           p + ("self_attn", "out_proj"), D, D, (D,), (N, H))
        yield from _norm(hf + "layer_norm1", p + ("layer_norm1",), D)
        yield from _norm(hf + "layer_norm2", p + ("layer_norm2",), D)
        yield from _linear(hf + "mlp.fc1", p + ("mlp", "fc1"), F, D, (F,), (D,))
        yield from _linear(hf + "mlp.fc2", p + ("mlp", "fc2"), D, F, (D,), (F,))
