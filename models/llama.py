"""Llama-family decoder (Llama 2/3/3.x, Mistral, Qwen2, Qwen3) in Flax linen.

Applied functionally: ``model.apply({"params": params}, ...)`` over an explicit
param pytree that loaders build. The architecture differences are all read
from ``ModelConfig`` (qkv bias, q/k norm, sliding window, tied embeddings);
there is no model-name branching in the layers.

Logical axis names (mapped to mesh axes by ``jaxinfer.sharding``):
``vocab``, ``embed`` (D), ``heads`` (N), ``kv_heads`` (K), ``head_dim`` (H),
``mlp`` (F).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from .attention import AttentionMetadata, paged_attention
from .config import ModelConfig
from .rope import apply_rope

_ACTS = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def _param(module, name, shape, axes, dtype, init=nn.initializers.normal(0.02)):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                        dtype)


class RMSNorm(nn.Module):
    dim: int
    eps: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        scale = _param(self, "scale", (self.dim,), ("norm",), self.dtype,
                       nn.initializers.ones)
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) +
                                self.eps)
        # HF casts back to the activation dtype before the weight multiply.
        return scale * xf.astype(x.dtype)


class Projection(nn.Module):
    """x @ W (+ b) with W of shape in_shape + out_shape (DenseGeneral-like,
    but with named logical axes and HF-compatible layout)."""
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    axes: tuple[str, ...]
    use_bias: bool
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        w = _param(self, "kernel", self.in_shape + self.out_shape, self.axes,
                   self.dtype)
        n_in = len(self.in_shape)
        x_axes = tuple(range(x.ndim - n_in, x.ndim))
        y = jax.lax.dot_general(x, w, ((x_axes, tuple(range(n_in))), ((), ())))
        if self.use_bias:
            y = y + _param(self, "bias", self.out_shape,
                           self.axes[n_in:], self.dtype, nn.initializers.zeros)
        return y


class Attention(nn.Module):
    cfg: ModelConfig
    backend: str
    dtype: jnp.dtype
    mesh: Any = None

    @nn.compact
    def __call__(self, x, cos_sin, kv, md: AttentionMetadata):
        c = self.cfg
        D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        q = Projection((D,), (N, H), ("embed", "heads", "head_dim"),
                       c.attention_bias, self.dtype, name="q_proj")(x)
        k = Projection((D,), (K, H), ("embed", "kv_heads", "head_dim"),
                       c.attention_bias, self.dtype, name="k_proj")(x)
        v = Projection((D,), (K, H), ("embed", "kv_heads", "head_dim"),
                       c.attention_bias, self.dtype, name="v_proj")(x)
        if c.qk_norm:
            q = RMSNorm(H, c.rms_norm_eps, self.dtype, name="q_norm")(q)
            k = RMSNorm(H, c.rms_norm_eps, self.dtype, name="k_norm")(k)
        q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
        out, kv = paged_attention(q, k, v, kv, md, backend=self.backend,
                                  sm_scale=H**-0.5,
                                  sliding_window=c.sliding_window,
                                  mesh=self.mesh)
        out = Projection((N, H), (D,), ("heads", "head_dim", "embed"), False,
                         self.dtype, name="o_proj")(out)
        return out, kv


class MLP(nn.Module):
    cfg: ModelConfig
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        D, F = c.hidden_size, c.intermediate_size
        gate = Projection((D,), (F,), ("embed", "mlp"), c.mlp_bias, self.dtype,
                          name="gate_proj")(x)
        up = Projection((D,), (F,), ("embed", "mlp"), c.mlp_bias, self.dtype,
                        name="up_proj")(x)
        h = _ACTS[c.hidden_act](gate) * up
        return Projection((F,), (D,), ("mlp", "embed"), c.mlp_bias, self.dtype,
                          name="down_proj")(h)


class DecoderLayer(nn.Module):
    cfg: ModelConfig
    backend: str
    dtype: jnp.dtype
    mesh: Any = None

    @nn.compact
    def __call__(self, x, cos_sin, kv, md):
        c = self.cfg
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype,
                    name="input_layernorm")(x)
        h, kv = Attention(c, self.backend, self.dtype, self.mesh,
                          name="self_attn")(
            h, cos_sin, kv, md)
        x = x + h
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype,
                    name="post_attention_layernorm")(x)
        return x + MLP(c, self.dtype, name="mlp")(h), kv


class LlamaForCausalLM(nn.Module):
    """``__call__`` runs the decoder over a ragged batch and returns
    (logits [S, V] float32 at ``logits_indices``, updated KV pages)."""
    cfg: ModelConfig
    backend: str = "reference"
    dtype: jnp.dtype = jnp.float32
    mesh: Any = None  # tensor-parallel mesh; Pallas kernels run per shard

    @nn.compact
    def __call__(
        self,
        input_ids,  # [T] int32
        positions,  # [T] int32
        kv_pages,  # list of L (k_pages, v_pages)
        md: AttentionMetadata,
        cos_sin_table,  # [max_model_len, H] float32 (see rope.py)
        logits_indices,  # [S] int32 token row whose logits each sequence needs
    ):
        c = self.cfg
        embedding = _param(self, "embedding", (c.vocab_size, c.hidden_size),
                           ("vocab", "embed"), self.dtype)
        x = jnp.take(embedding, input_ids, axis=0)
        cos_sin = jnp.take(cos_sin_table, positions, axis=0)
        new_pages = []
        for i in range(c.num_layers):
            x, kv = DecoderLayer(c, self.backend, self.dtype, self.mesh,
                                 name=f"layers_{i}")(x, cos_sin, kv_pages[i], md)
            new_pages.append(kv)
        x = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype, name="norm")(x)
        x = jnp.take(x, logits_indices, axis=0)
        if c.tie_word_embeddings:
            logits = x @ embedding.T
        else:
            lm_head = _param(self, "lm_head", (c.hidden_size, c.vocab_size),
                             ("embed", "vocab"), self.dtype)
            logits = x @ lm_head
        return logits.astype(jnp.float32), new_pages
