"""Gemma 2 and Gemma 3 (text) decoders in Flax linen, and their specs.

What sets the family apart from Llama, all read from ``GemmaConfig``:

- norms store ``w`` and scale by ``1 + w`` (``UnitOffsetRMSNorm``), and
  every layer normalizes the attention and MLP outputs too (four norms);
- the embedding rows are multiplied by sqrt(hidden) (rounded to the
  model's dtype first, as HF does);
- the attention scale is ``query_pre_attn_scalar ** -0.5``, not
  ``head_dim ** -0.5``; attention logits and final logits may be
  soft-capped (``cap * tanh(x / cap)``);
- layers alternate between sliding-window and global attention
  (``layer_types``); Gemma 3's sliding layers have a RoPE base of their
  own (a second cos/sin table), and it normalizes q and k per head.

A layer's kind (sliding or global) is part of its static settings, so the
step traces one layer of each kind and calls it for every layer of that
kind. The layers are not alike, so the model declares no pipeline stages
(the engine refuses ``pipeline_parallel_size > 1`` for it).
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

from .attention import AttentionMetadata, paged_attention
from .config import ModelConfig, RopeScaling, _rope_from_hf, decoder_config_from_hf
from .errors import ModelConfigError
from .layers import Linear, UnitOffsetRMSNorm, compute_together, param, rows_times_table
from .llama import attention_weights
from .mlp import GatedMLP
from .quantization import linear_method
from .rope import apply_rope, rope_cos_sin_table
from .spec import GGUFNames, ModelSpec, WeightSpec

ROPE_TABLE = "rope_cos_sin"  # global layers: [max_model_len, H] f32
LOCAL_ROPE_TABLE = "rope_cos_sin_local"  # sliding layers' own base
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class GemmaConfig(ModelConfig):
    """``ModelConfig`` plus what Gemma 2/3 add."""
    attn_logit_softcap: float | None = None  # cap * tanh(s / cap) on q.k
    final_logit_softcap: float | None = None  # the same on the logits
    query_pre_attn_scalar: float = 256.0  # attention scale = this ** -0.5
    # Per layer, HF's names: "sliding_attention" (the last sliding_window
    # positions) or "full_attention". At least num_layers entries.
    layer_types: tuple[str, ...] = ()
    # The RoPE of sliding layers (Gemma 3's rope_local_base_freq); global
    # layers use rope_theta / rope_scaling.
    local_rope_theta: float = 10000.0
    local_rope_scaling: RopeScaling = RopeScaling()

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = sorted(set(self.layer_types) - {SLIDING, FULL})
        if unknown:
            raise ModelConfigError(
                f"layer_types holds {unknown}; each entry must be "
                f"{SLIDING!r} or {FULL!r}")
        if len(self.layer_types) < self.num_layers:
            raise ModelConfigError(
                f"layer_types has {len(self.layer_types)} entries for "
                f"{self.num_layers} layers")
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and cap <= 0:
                raise ModelConfigError(f"{name} must be > 0 or None, got {cap}")
        if self.query_pre_attn_scalar <= 0:
            raise ModelConfigError("query_pre_attn_scalar must be > 0, got "
                                   f"{self.query_pre_attn_scalar}")

    def window_of(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (None: attends to everything)."""
        return (self.sliding_window if self.layer_types[layer] == SLIDING
                else None)

    def local_rope(self) -> ModelConfig:
        """This config with the sliding layers' RoPE as its own."""
        return dataclasses.replace(self, rope_theta=self.local_rope_theta,
                                   rope_scaling=self.local_rope_scaling)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    return x if cap is None else cap * jnp.tanh(x / cap)


class GemmaAttention(nn.Module):
    cfg: GemmaConfig
    backend: str
    dtype: jnp.dtype
    mesh: Any = None
    window: int | None = None  # this layer's sliding window

    @nn.compact
    def __call__(self, x: jax.Array, cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                 md: AttentionMetadata) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        c = self.cfg
        D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        q = Linear((D,), (N, H), ("embed", "heads", "head_dim"), False,
                   self.dtype, linear_method(c), name="q_proj")(x, pending=True)
        k = Linear((D,), (K, H), ("embed", "kv_heads", "head_dim"), False,
                   self.dtype, linear_method(c), name="k_proj")(x, pending=True)
        v = Linear((D,), (K, H), ("embed", "kv_heads", "head_dim"), False,
                   self.dtype, linear_method(c), name="v_proj")(x, pending=True)
        q, k, v = compute_together(q, k, v)
        if c.qk_norm:
            q = UnitOffsetRMSNorm(H, c.rms_norm_eps, self.dtype, name="q_norm")(q)
            k = UnitOffsetRMSNorm(H, c.rms_norm_eps, self.dtype, name="k_norm")(k)
        q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
        out, kv = paged_attention(q, k, v, kv, md, backend=self.backend,
                                  sm_scale=c.query_pre_attn_scalar**-0.5,
                                  sliding_window=self.window,
                                  logit_soft_cap=c.attn_logit_softcap,
                                  mesh=self.mesh)
        out = Linear((N, H), (D,), ("heads", "head_dim", "embed"), False,
                     self.dtype, linear_method(c), name="o_proj")(out)
        return out, kv


class GemmaDecoderLayer(nn.Module):
    cfg: GemmaConfig
    backend: str
    dtype: jnp.dtype
    mesh: Any = None
    window: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array, cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                 md: AttentionMetadata) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        c = self.cfg

        def norm(name: str) -> UnitOffsetRMSNorm:
            return UnitOffsetRMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype,
                                     name=name)

        h, kv = GemmaAttention(c, self.backend, self.dtype, self.mesh,
                               self.window, name="self_attn")(
            norm("input_layernorm")(x), cos_sin, kv, md)
        x = x + norm("post_attention_layernorm")(h)
        h = GatedMLP(c, self.dtype, name="mlp")(norm("pre_feedforward_layernorm")(x))
        return x + norm("post_feedforward_layernorm")(h), kv


@functools.partial(jax.jit, static_argnums=(0,))
def apply_layer(layer: tuple, variables: dict, x: jax.Array, cos_sin: jax.Array,
                kv: tuple[jax.Array, ...], md: AttentionMetadata
                ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """One decoder layer on its own variables, jitted on its settings
    (``layer`` = GemmaDecoderLayer's fields): the step traces one layer
    per kind (sliding, global) and calls it for each layer of the kind
    (see ``llama.apply_layer``)."""
    return GemmaDecoderLayer(*layer).apply(  # type: ignore[return-value]
        variables, x, cos_sin, kv, md)


class GemmaForCausalLM(nn.Module):
    """``__call__`` -> (logits [S, V] float32 at ``logits_indices``, pages)."""
    cfg: GemmaConfig
    backend: str = "reference"
    dtype: jnp.dtype = jnp.float32
    mesh: Any = None

    # Every layer holds the same params (a layer's kind changes its code,
    # not its weights), unless a quantization gives some their own method.
    uniform_layers: ClassVar[bool] = True

    def layers_alike(self) -> bool:
        q = getattr(self.cfg, "quantization", None)
        return q is None or not getattr(q, "overrides", ())

    def layer_config(self, name: str) -> GemmaConfig:
        """The config layer ``name`` runs under on its own: the quantization
        overrides under it, re-keyed to paths that start at the layer
        (as ``LlamaForCausalLM.layer_config``)."""
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
        """The RoPE cos/sin rows of every position, for global layers and
        for sliding ones (the same table unless the config gives sliding
        layers their own base)."""
        return {ROPE_TABLE: rope_cos_sin_table(self.cfg, max_model_len),
                LOCAL_ROPE_TABLE: rope_cos_sin_table(self.cfg.local_rope(),
                                                     max_model_len)}

    def embed(self, input_ids: jax.Array) -> jax.Array:  # [T] -> [T, D]
        """The scaled token embeddings (what ``inputs_embeds`` replaces)."""
        return _scaled_embedding(self.get_variable("params", "embedding"),
                                 input_ids, self.cfg.hidden_size)

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,  # [T] int32
        positions: jax.Array,  # [T] int32
        kv_pages: list[tuple[jax.Array, ...]],  # L of (k_pages, v_pages)
        md: AttentionMetadata,
        logits_indices: jax.Array,  # [S] int32
        inputs_embeds: jax.Array | None = None,  # [T, D], already scaled
    ) -> tuple[jax.Array, list[tuple[jax.Array, ...]]]:
        c = self.cfg
        embedding = param(self, "embedding", (c.vocab_size, c.hidden_size),
                          ("vocab", "embed"), self.dtype)
        rows = {}
        for name in (ROPE_TABLE, LOCAL_ROPE_TABLE):
            table = self.variable("constants", name,
                                  lambda: jnp.zeros((1, c.head_dim), jnp.float32))
            rows[name] = jnp.take(table.value, positions, axis=0)
        x = (_scaled_embedding(embedding, input_ids, c.hidden_size)
             if inputs_embeds is None else inputs_embeds)
        new_pages = []
        for i in range(c.num_layers):
            name, window = f"layers_{i}", c.window_of(i)
            cos_sin = rows[ROPE_TABLE if window is None else LOCAL_ROPE_TABLE]
            if self.is_initializing():
                x, kv = GemmaDecoderLayer(c, self.backend, self.dtype, self.mesh,
                                          window, name=name)(
                    x, cos_sin, kv_pages[i], md)
            else:
                own = {col: tree[name] for col, tree in self.variables.items()
                       if name in tree}
                layer = (self.layer_config(name), self.backend, self.dtype,
                         self.mesh, window)
                x, kv = apply_layer(layer, own, x, cos_sin, kv_pages[i], md)
            new_pages.append(kv)
        x = jnp.take(UnitOffsetRMSNorm(c.hidden_size, c.rms_norm_eps,
                                       self.dtype, name="norm")(x),
                     logits_indices, axis=0)
        if c.tie_word_embeddings:
            logits = rows_times_table(x, embedding)
        else:
            logits = x @ param(self, "lm_head", (c.hidden_size, c.vocab_size),
                               ("embed", "vocab"), self.dtype)
        return soft_cap(logits.astype(jnp.float32), c.final_logit_softcap), new_pages


def _scaled_embedding(embedding: jax.Array, input_ids: jax.Array,
                      hidden: int) -> jax.Array:
    # HF rounds sqrt(hidden) to the weights' dtype before multiplying.
    scale = jnp.asarray(hidden**0.5, embedding.dtype)
    return jnp.take(embedding, input_ids, axis=0) * scale


# -- checkpoint names -------------------------------------------------------

LAYER_NORMS = ("input_layernorm", "post_attention_layernorm",
               "pre_feedforward_layernorm", "post_feedforward_layernorm")


def gemma_weights(cfg: ModelConfig) -> Iterator[WeightSpec]:
    D, V = cfg.hidden_size, cfg.vocab_size
    yield WeightSpec("model.embed_tokens.weight", ("embedding",), (V, D))
    for i in range(cfg.num_layers):
        hf, p = f"model.layers.{i}.", (f"layers_{i}",)
        for norm in LAYER_NORMS:
            yield WeightSpec(hf + f"{norm}.weight", p + (norm, "scale"), (D,))
        yield from attention_weights(cfg, hf + "self_attn.", p + ("self_attn",))
        yield from GatedMLP.weights(cfg, hf + "mlp.", p + ("mlp",))
    yield WeightSpec("model.norm.weight", ("norm", "scale"), (D,))
    if not cfg.tie_word_embeddings:
        yield WeightSpec("lm_head.weight", ("lm_head",), (V, D),
                         lambda w: np.asarray(w).T)


# llama.cpp's tensor names for gemma2 / gemma3.
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
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




def _gguf_config(get: Any, cfg: dict) -> dict:
    """Gemma fields from llama.cpp's metadata. Its files carry the soft
    caps and the window, not query_pre_attn_scalar: llama.cpp scales
    attention by head_dim ** -0.5, except for the 27B shapes (46 layers of
    Gemma 2, 62 of Gemma 3), where by (hidden / heads) ** -0.5, as their HF
    configs say; the layer pattern is the family's default."""
    out: dict = {"hidden_activation": "gelu_pytorch_tanh",
                 "tie_word_embeddings": cfg["tie_word_embeddings"]}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if get(key) is not None:  # absent: the family's default caps
            out[key] = float(get(key))
    wide = cfg["num_hidden_layers"] in (46, 62)
    out["query_pre_attn_scalar"] = (
        cfg["hidden_size"] // cfg["num_attention_heads"] if wide
        else cfg["head_dim"])
    return out


def _gguf_norms(hf_name: str, w: np.ndarray) -> np.ndarray:
    """llama.cpp stores Gemma's norm weights as 1 + w; ours are w."""
    return w - 1.0 if hf_name.endswith("norm.weight") else w


# -- configs ----------------------------------------------------------------

def _layer_types(hf: dict, default_pattern: int) -> tuple[str, ...]:
    """HF's layer_types, or (older configs) every ``pattern``-th layer
    global and the rest sliding."""
    types = hf.get("layer_types")
    if types is not None:
        return tuple(types)
    pattern = int(hf.get("sliding_window_pattern") or default_pattern)
    return tuple(SLIDING if (i + 1) % pattern else FULL
                 for i in range(int(hf["num_hidden_layers"])))


def _ropes(hf: dict) -> dict[str, Any]:
    """Global and sliding-layer RoPE: transformers >= 5 writes one
    rope_parameters dict per layer type; older Gemma 3 configs write
    rope_theta / rope_scaling (global) and rope_local_base_freq."""
    params = hf.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:
        theta, scaling = _rope_from_hf({"rope_parameters": params.get(FULL) or {}})
        local_theta, local_scaling = _rope_from_hf(
            {"rope_parameters": params.get(SLIDING) or {}})
    else:
        theta, scaling = _rope_from_hf(hf)
        local_theta, local_scaling = float(
            hf.get("rope_local_base_freq", 10000.0)), RopeScaling()
    return dict(rope_theta=theta, rope_scaling=scaling,
                local_rope_theta=local_theta, local_rope_scaling=local_scaling)


def _config_parser(architecture: str, default_pattern: int, qk_norm: bool,
                   default_caps: tuple[float | None, float | None]
                   ) -> Callable[[dict], GemmaConfig]:
    def config_from_hf(hf: dict) -> GemmaConfig:
        for field in ("attention_bias", "use_bidirectional_attention"):
            if hf.get(field):
                raise ModelConfigError(
                    f"{architecture} with {field}=true is not supported; "
                    "the released checkpoints have it false")
        attn_cap, final_cap = default_caps
        return decoder_config_from_hf(
            hf, architecture, GemmaConfig, qk_norm=qk_norm,
            hidden_act=hf.get("hidden_activation") or hf.get("hidden_act")
            or "gelu_pytorch_tanh",
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            attn_logit_softcap=hf.get("attn_logit_softcapping", attn_cap),
            final_logit_softcap=hf.get("final_logit_softcapping", final_cap),
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            layer_types=_layer_types(hf, default_pattern),
            **_ropes(hf))
    return config_from_hf


def _spec(architecture: str, gguf_arch: str, default_pattern: int,
          qk_norm: bool, default_caps: tuple[float | None, float | None]
          ) -> ModelSpec:
    return ModelSpec(
        architecture=architecture, model=GemmaForCausalLM,
        config_from_hf=_config_parser(architecture, default_pattern, qk_norm,
                                      default_caps),
        weights=gemma_weights,
        gguf=GGUFNames(gguf_arch, GGUF_LAYER_NAMES, GGUF_TOP_NAMES,
                       config_fields=_gguf_config, from_stored=_gguf_norms))


# HF's defaults where a config leaves a field out: Gemma 2 alternates
# sliding and global layers and soft-caps (50 on attention, 30 on the
# logits); Gemma 3 has five sliding layers per global one, q/k norms and no
# soft-capping.
SPECS = (
    _spec("Gemma2ForCausalLM", "gemma2", 2, qk_norm=False,
          default_caps=(50.0, 30.0)),
    _spec("Gemma3ForCausalLM", "gemma3", 6, qk_norm=True,
          default_caps=(None, None)),
)
