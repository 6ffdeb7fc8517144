"""Llama-family decoder (Llama 2/3/3.x, Mistral, Qwen2, Qwen3) in Flax linen,
and the specs that register it.

Applied functionally over an explicit param pytree that loaders build (see
``runtime.py`` for the call). The architecture differences are all read from
``ModelConfig`` (qkv bias, q/k norm, sliding window, tied embeddings); there
is no model-name branching in the layers. The MLP is a pluggable module
(``mlp_cls``, see ``mlp.py``).

Logical axis names (mapped to mesh axes by ``jaxinfer.sharding``):
``vocab``, ``embed`` (D), ``heads`` (N), ``kv_heads`` (K), ``head_dim`` (H),
``mlp`` (F), and ``qkv_group`` (G + 2) of the one q/k/v weight that
``ModelConfig.fused_qkv`` chooses (``fused_qkv.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from . import fused_qkv
from .attention import AttentionMetadata, paged_attention
from .config import ModelConfig, decoder_config_from_hf
from .layers import Linear, RMSNorm, compute_together, param, rows_times_table
from .mlp import GatedMLP
from .quantization import linear_method
from .rope import rope_cos_sin_table
from .spec import GGUFNames, ModelSpec, WeightSpec, keep_layout, linear_from_hf, reshape_to

ROPE_TABLE = "rope_cos_sin"  # the model's constant: [max_model_len, H] f32
INTERMEDIATES = "intermediates"  # flax's collection of sown values


def layer_input_name(i: int) -> str:
    """The sown name of the residual stream entering decoder layer ``i``."""
    return f"layer_input_{i}"


class Attention(nn.Module):
    cfg: ModelConfig
    backend: str
    dtype: jnp.dtype
    mesh: Any = None
    # Width of x when q, k and v read other rows than the model's (an EAGLE-3
    # head's concatenated embeddings and features); None: hidden_size.
    in_dim: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array, cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                 md: AttentionMetadata) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        c = self.cfg
        D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        Din = self.in_dim or D
        if c.fused_qkv:  # one weight [Din, K, G + 2, H] (fused_qkv.py)
            qkv = Linear((Din,), fused_qkv.group_shape(c),
                         fused_qkv.KERNEL_AXES, c.attention_bias, self.dtype,
                         linear_method(c), name=fused_qkv.FUSED)(x)
            q, k, v = fused_qkv.split(qkv, N)
        else:
            # q, k and v on the int4 kernel run as one call (compute_together).
            q, k, v = compute_together(
                Linear((Din,), (N, H), ("embed", "heads", "head_dim"),
                       c.attention_bias, self.dtype, linear_method(c),
                       name="q_proj")(x, pending=True),
                Linear((Din,), (K, H), ("embed", "kv_heads", "head_dim"),
                       c.attention_bias, self.dtype, linear_method(c),
                       name="k_proj")(x, pending=True),
                Linear((Din,), (K, H), ("embed", "kv_heads", "head_dim"),
                       c.attention_bias, self.dtype, linear_method(c),
                       name="v_proj")(x, pending=True))
        qk_norm = None
        if c.qk_norm:
            qk_norm = (RMSNorm(H, c.rms_norm_eps, self.dtype, name="q_norm").scale,
                       RMSNorm(H, c.rms_norm_eps, self.dtype, name="k_norm").scale,
                       c.rms_norm_eps)
        # The q/k norms, RoPE and the K/V write run in paged_attention (one
        # kernel on the Pallas backends).
        out, kv = paged_attention(q, k, v, kv, md, backend=self.backend,
                                  sm_scale=H**-0.5,
                                  sliding_window=c.sliding_window,
                                  mesh=self.mesh, cos_sin=cos_sin,
                                  qk_norm=qk_norm)
        out = Linear((N, H), (D,), ("heads", "head_dim", "embed"), False,
                     self.dtype, linear_method(c), name="o_proj")(out)
        return out, kv


class DecoderLayer(nn.Module):
    cfg: ModelConfig
    backend: str
    dtype: jnp.dtype
    mlp_cls: Any  # a module class of mlp.py
    mesh: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                 md: AttentionMetadata) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        c = self.cfg
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype,
                    name="input_layernorm")(x)
        h, kv = Attention(c, self.backend, self.dtype, self.mesh,
                          name="self_attn")(h, cos_sin, kv, md)
        x = x + h
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype,
                    name="post_attention_layernorm")(x)
        return x + self.mlp_cls(c, self.dtype, mesh=self.mesh, name="mlp")(h), kv


@functools.partial(jax.jit, static_argnums=(0,))
def apply_layer(layer: tuple, variables: dict, x: jax.Array, cos_sin: jax.Array,
                kv: tuple[jax.Array, ...], md: AttentionMetadata
                ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """One decoder layer applied to its own variables (its params, and any
    other collection's entries at its scope, e.g. LoRA adapters), as a
    jitted function of the layer's settings (``layer`` = DecoderLayer's
    fields): every layer of a step has the same shapes, so the step traces
    and lowers the layer once and calls it L times (XLA inlines the calls;
    the program is the same as an unrolled one). Tracing every layer
    unrolled would be most of each step program's build time, at warm-up
    and on every cache-warm start."""
    # flax types apply's result as if mutable collections could come back.
    return DecoderLayer(*layer).apply(  # type: ignore[return-value]
        variables, x, cos_sin, kv, md)


class LlamaForCausalLM(nn.Module):
    """``__call__`` runs the decoder over a ragged batch and returns
    (logits [S, V] float32 at ``logits_indices``, updated KV pages)."""
    cfg: ModelConfig
    backend: str = "reference"
    dtype: jnp.dtype = jnp.float32
    mesh: Any = None  # tensor-parallel mesh; Pallas kernels run per shard

    mlp_cls: ClassVar[type] = GatedMLP  # a subclass may plug another MLP
    # Every layer has the same params (abstract.abstract_variables inits one)
    # unless a quantization gives some layers their own method (layers_alike).
    uniform_layers: ClassVar[bool] = True

    def layers_alike(self) -> bool:
        """All layers hold the same params and run the same code, so one
        traced layer serves them all and one layer's init gives the params'
        tree: not so when a quantization config names layers of their own
        method (its ``overrides``, by param path; then each pattern has its
        own trace, `layer_config`)."""
        q = getattr(self.cfg, "quantization", None)
        return q is None or not getattr(q, "overrides", ())

    def layer_config(self, name: str) -> ModelConfig:
        """The config layer ``name`` runs under when applied on its own
        (`apply_layer`, where its modules' paths start at the layer): the
        quantization overrides under it, re-keyed to those paths. Layers
        with the same overrides get equal configs, so they share one
        trace (a GGUF file gives a few layers other block types). Without
        overrides, the model's own config."""
        if self.layers_alike():
            return self.cfg
        q = self.cfg.quantization
        prefix = tuple(self.path) + (name,)
        n = len(prefix)
        local = tuple((p[n:], m) for p, m in q.overrides
                      if tuple(p[:n]) == prefix)
        return dataclasses.replace(
            self.cfg, quantization=dataclasses.replace(q, overrides=local))

    def constants(self, max_model_len: int) -> dict[str, np.ndarray]:
        """The host-built tables ``__call__`` reads from its ``constants``
        collection: the RoPE cos/sin rows of every position."""
        return {ROPE_TABLE: rope_cos_sin_table(self.cfg, max_model_len)}

    def embed(self, input_ids: jax.Array) -> jax.Array:  # [T] int32 -> [T, D]
        """The token embeddings an encoder's outputs are merged into
        (``model.apply(..., method="embed")``), then given back to
        ``__call__`` as ``inputs_embeds``."""
        return jnp.take(self.get_variable("params", "embedding"), input_ids,
                        axis=0)

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,  # [T] int32
        positions: jax.Array,  # [T] int32
        kv_pages: list[tuple[jax.Array, ...]],  # L of (k_pages, v_pages)
        md: AttentionMetadata,
        logits_indices: jax.Array,  # [S] int32 token row whose logits each sequence needs
        inputs_embeds: jax.Array | None = None,  # [T, D]: replaces the lookup of input_ids
    ) -> tuple[jax.Array, list[tuple[jax.Array, ...]]]:
        c = self.cfg
        embedding = param(self, "embedding", (c.vocab_size, c.hidden_size),
                          ("vocab", "embed"), self.dtype)
        table = self.variable("constants", ROPE_TABLE,
                              lambda: jnp.zeros((1, c.head_dim), jnp.float32))
        x, cos_sin = _layer_inputs(embedding, table.value, input_ids,
                                   positions, inputs_embeds)
        new_pages = []
        layer = (c, self.backend, self.dtype, self.mlp_cls, self.mesh)
        for i in range(c.num_layers):
            name = f"layers_{i}"
            # The residual stream entering layer i, kept only when the
            # caller makes "intermediates" mutable (runtime.run_model_tapped).
            if not self.is_initializing():
                self.sow(INTERMEDIATES, layer_input_name(i), x)
            if self.is_initializing():  # submodules create the params
                x, kv = DecoderLayer(*layer, name=name)(x, cos_sin,
                                                       kv_pages[i], md)
            else:
                # Layers of one quantization pattern share one traced
                # layer (apply_layer's jit cache keys on the settings).
                own_layer = (self.layer_config(name), *layer[1:])
                own = {col: tree[name] for col, tree in self.variables.items()
                       if name in tree}
                x, kv = apply_layer(own_layer, own, x, cos_sin, kv_pages[i],
                                    md)
            new_pages.append(kv)
        norm = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype, name="norm")
        lm_head = None if c.tie_word_embeddings else param(
            self, "lm_head", (c.hidden_size, c.vocab_size), ("embed", "vocab"),
            self.dtype)
        return _head(norm, x, logits_indices, embedding, lm_head), new_pages

    # -- pipeline stages --------------------------------------------------
    # Pipeline parallelism (jaxinfer.sharding.pipeline) runs __call__ as its
    # three parts on different devices: the layer inputs, every decoder
    # layer (one module, applied with params["layers_{i}"]), the head. Each
    # part runs the functions __call__ runs, over the bound variables.

    def layer_inputs(self, input_ids: jax.Array, positions: jax.Array,
                     inputs_embeds: jax.Array | None = None
                     ) -> tuple[jax.Array, jax.Array]:
        """-> (x [T, D], the per-layer inputs every layer gets: cos_sin)."""
        return _layer_inputs(self.get_variable("params", "embedding"),
                             self.get_variable("constants", ROPE_TABLE),
                             input_ids, positions, inputs_embeds)

    @nn.nowrap
    def decoder_layer(self) -> nn.Module:
        """Any layer of __call__, unbound: (x, cos_sin, kv, md) -> (x, kv)."""
        return DecoderLayer(self.cfg, self.backend, self.dtype, self.mlp_cls,
                            self.mesh)

    def head(self, x: jax.Array, logits_indices: jax.Array) -> jax.Array:
        """Final norm and lm_head at ``logits_indices`` -> [S, V] float32."""
        c = self.cfg
        norm = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype, parent=None)
        norm_with_params = functools.partial(
            norm.apply, {"params": self.get_variable("params", "norm")})
        lm_head = (None if c.tie_word_embeddings
                   else self.get_variable("params", "lm_head"))
        return _head(norm_with_params, x, logits_indices,
                     self.get_variable("params", "embedding"), lm_head)


def _layer_inputs(embedding: jax.Array, rope_table: jax.Array,
                  input_ids: jax.Array, positions: jax.Array,
                  inputs_embeds: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """The decoder's input rows and each token's RoPE cos/sin row: ([T,
    D], [T, H]); ``inputs_embeds`` [T, D] stands in for the lookup."""
    x = (jnp.take(embedding, input_ids, axis=0) if inputs_embeds is None
         else inputs_embeds)
    return x, jnp.take(rope_table, positions, axis=0)


def _head(norm: Callable[[jax.Array], Any], x: jax.Array,
          logits_indices: jax.Array, embedding: jax.Array,
          lm_head: jax.Array | None = None) -> jax.Array:
    """The final ``norm`` of the rows at ``logits_indices`` [S], then their
    [S, V] float32 logits through lm_head [D, V], or through the embedding
    table [V, D] when the two are tied (``lm_head`` None)."""
    x = jnp.take(norm(x), logits_indices, axis=0)
    logits = rows_times_table(x, embedding) if lm_head is None else x @ lm_head
    return logits.astype(jnp.float32)


# -- checkpoint names -------------------------------------------------------

def attention_weights(cfg: ModelConfig, hf: str, path: tuple
                      ) -> Iterator[WeightSpec]:
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if cfg.fused_qkv:
        yield from fused_qkv.qkv_specs(cfg, hf, path)
    else:
        for name, heads in (("q_proj", N), ("k_proj", K), ("v_proj", K)):
            yield WeightSpec(hf + f"{name}.weight", path + (name, "kernel"),
                             (heads * H, D), linear_from_hf((heads, H), (D,)))
            if cfg.attention_bias:
                yield WeightSpec(hf + f"{name}.bias", path + (name, "bias"),
                                 (heads * H,), reshape_to((heads, H)))
    yield WeightSpec(hf + "o_proj.weight", path + ("o_proj", "kernel"),
                     (D, N * H), linear_from_hf((D,), (N, H)))
    if cfg.qk_norm:
        for name in ("q_norm", "k_norm"):
            yield WeightSpec(hf + f"{name}.weight", path + (name, "scale"),
                             (H,), keep_layout)


def decoder_weights(cfg: ModelConfig, mlp_cls: Any = GatedMLP,
                    mlp_hf: str = "mlp") -> Iterator[WeightSpec]:
    """HF's Llama names, which Mistral and Qwen2/3 share; ``mlp_cls`` names
    the MLP's own tensors, under the layer's ``mlp_hf`` module."""
    D, V = cfg.hidden_size, cfg.vocab_size
    yield WeightSpec("model.embed_tokens.weight", ("embedding",), (V, D))
    for i in range(cfg.num_layers):
        hf, p = f"model.layers.{i}.", (f"layers_{i}",)
        yield WeightSpec(hf + "input_layernorm.weight",
                         p + ("input_layernorm", "scale"), (D,))
        yield WeightSpec(hf + "post_attention_layernorm.weight",
                         p + ("post_attention_layernorm", "scale"), (D,))
        yield from attention_weights(cfg, hf + "self_attn.", p + ("self_attn",))
        yield from mlp_cls.weights(cfg, hf + f"{mlp_hf}.", p + ("mlp",))
    yield WeightSpec("model.norm.weight", ("norm", "scale"), (D,))
    if not cfg.tie_word_embeddings:
        yield WeightSpec("lm_head.weight", ("lm_head",), (V, D),
                         lambda w: np.asarray(w).T)


# llama.cpp's tensor names (its converter's map, for the Llama-family archs).
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _spec(architecture: str, gguf_arch: str, permuted_qk: bool,
          **family_fields: Callable[[dict], Any]) -> ModelSpec:
    def config_from_hf(hf: dict) -> ModelConfig:
        fields = {k: f(hf) for k, f in family_fields.items()}
        return decoder_config_from_hf(hf, architecture, **fields)
    return ModelSpec(
        architecture=architecture, model=LlamaForCausalLM,
        config_from_hf=config_from_hf, weights=decoder_weights,
        gguf=GGUFNames(gguf_arch, GGUF_LAYER_NAMES, GGUF_TOP_NAMES,
                       permuted_qk=permuted_qk),
        fuses_qkv=True)


# Every variant is the same module; the config carries the differences.
# HF's Qwen2 always has q/k/v biases (its config has no field for them);
# Qwen3 always normalizes q and k.
SPECS = (
    _spec("LlamaForCausalLM", "llama", permuted_qk=True),
    _spec("MistralForCausalLM", "mistral", permuted_qk=True),
    _spec("Qwen2ForCausalLM", "qwen2", permuted_qk=False,
          attention_bias=lambda hf: bool(hf.get("attention_bias", True))),
    _spec("Qwen3ForCausalLM", "qwen3", permuted_qk=False,
          qk_norm=lambda hf: True),
)
