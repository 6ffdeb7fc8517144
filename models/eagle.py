"""EAGLE draft heads for Llama-family targets (vLLM's ``eagle`` and
``eagle3`` speculative methods): the module, its checkpoint names and its
config.

A head is one decoder layer that drafts from the target's own features.
At position p it reads the token x_{p+1} and a feature f_p, and its output
(the feature of p + 1) predicts x_{p+2}:

- EAGLE-1: f_p is the target's final-norm hidden state at p (what HF's
  ``last_hidden_state`` holds). The layer's input is fc(concat(embed(x),
  f)); the layer has no input norm; its output, unnormed, goes through the
  target's lm_head. Checkpoint: ``fc.weight`` [D, 2D] (``fc.bias``
  optional), ``layers.0.*`` without ``input_layernorm``, optionally
  ``embed_tokens.weight``.
- EAGLE-3: f_p = fc(concat of the target's residual stream entering three
  of its layers) ([D, 3D]); q/k/v read concat(input_layernorm(embed(x)),
  hidden_norm(f)) ([2D]); the output's final ``norm`` feeds the head's own
  ``lm_head`` over a draft vocabulary, whose id i is target id i +
  ``d2t[i]``. Checkpoint: ``midlayer.*``, ``fc.weight``, ``norm.weight``,
  ``lm_head.weight``, ``d2t``, optionally ``t2d`` (not needed to draft)
  and ``embed_tokens.weight``.

Drafting feeds the head's own output feature back as the next position's
f (both heads; EAGLE-3's before its final norm, and without its fc).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .attention import AttentionMetadata
from .config import ModelConfig, decoder_config_from_hf
from .errors import CheckpointError, ModelConfigError
from .layers import RMSNorm, param, rows_times_table
from .llama import ROPE_TABLE, Attention, attention_weights
from .mlp import GatedMLP
from .rope import rope_cos_sin_table
from .runtime import FINAL_NORM
from .spec import WeightSpec, linear_from_hf, reshape_to
from .weights import check_shape

EAGLE_METHODS = ("eagle", "eagle3")


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """A head's settings, from its config.json and the target's."""
    method: str  # "eagle" or "eagle3"
    cfg: ModelConfig  # the head's layer (D, heads, F, RoPE, eps)
    taps: tuple  # the target's hidden states it reads (runtime.Tap)
    draft_vocab_size: int  # eagle3's lm_head rows; eagle: the target's V
    fc_bias: bool = False  # eagle: fc has a bias
    own_embedding: bool = False  # the checkpoint has embed_tokens.weight
    norm_before_residual: bool = False  # eagle3: the residual is normed

    @property
    def tap_width(self) -> int:
        """Width of the target's hidden state the head reads per token."""
        return self.cfg.hidden_size * len(self.taps)


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's EAGLE-3 taps for a target of ``num_layers`` layers."""
    return (2, num_layers // 2, num_layers - 3)


def eagle_config(method: str, hf: dict, names: set[str],
                 target_layers: int) -> EagleConfig:
    """The head's config from its config.json ``hf`` and its checkpoint's
    tensor ``names``; ``target_layers``: the target's decoder layers."""
    if method not in EAGLE_METHODS:
        raise ModelConfigError(f"{method!r} is not an EAGLE method")
    cfg = decoder_config_from_hf(hf, "LlamaForCausalLM")
    if cfg.num_layers != 1:
        raise ModelConfigError(
            f"an EAGLE head of {cfg.num_layers} layers: only one-layer heads "
            "are served")
    if method == "eagle":
        return EagleConfig(method, cfg, (FINAL_NORM,), cfg.vocab_size,
                           fc_bias="fc.bias" in names,
                           own_embedding="embed_tokens.weight" in names)
    eagle = hf.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state", True) is False:
        raise ModelConfigError(
            "an EAGLE-3 head without auxiliary hidden states "
            "(eagle_config.use_aux_hidden_state false)")
    target_hidden = hf.get("target_hidden_size")
    if target_hidden not in (None, cfg.hidden_size):
        raise ModelConfigError(
            f"an EAGLE-3 head whose target_hidden_size ({target_hidden}) is "
            f"not its hidden_size ({cfg.hidden_size})")
    ids = hf.get("eagle_aux_hidden_state_layer_ids")
    taps = (tuple(int(i) for i in ids) if ids
            else default_aux_layers(target_layers))
    if len(taps) != 3 or not all(0 <= i < target_layers for i in taps):
        raise ModelConfigError(
            f"EAGLE-3 aux hidden state layers {taps}: three layer ids of the "
            f"target's {target_layers} are needed (set "
            "eagle_aux_hidden_state_layer_ids)")
    return EagleConfig(method, cfg, taps,
                       int(hf.get("draft_vocab_size") or cfg.vocab_size),
                       own_embedding="embed_tokens.weight" in names,
                       norm_before_residual=bool(
                           hf.get("norm_before_residual", False)))


class EagleLayer(nn.Module):
    """The head's decoder layer: EAGLE-1's (no input norm) or EAGLE-3's
    (q/k/v over the normed embeddings and features side by side)."""
    ec: EagleConfig
    backend: str
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x: jax.Array, embeds: jax.Array,
                 cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                 md: AttentionMetadata) -> tuple[jax.Array, tuple]:
        """x [T, D]: the layer's input (EAGLE-1: fc's output; EAGLE-3: the
        feature); embeds [T, D] (EAGLE-3). -> (output [T, D], kv)."""
        c, D = self.ec.cfg, self.ec.cfg.hidden_size
        eagle3 = self.ec.method == "eagle3"

        def norm(name: str) -> RMSNorm:
            return RMSNorm(D, c.rms_norm_eps, self.dtype, name=name)
        h = x
        if eagle3:
            h = norm("hidden_norm")(x)
            if self.ec.norm_before_residual:
                x = h
            h = jnp.concatenate([norm("input_layernorm")(embeds), h], -1)
        h, kv = Attention(c, self.backend, self.dtype,
                          in_dim=2 * D if eagle3 else None,
                          name="self_attn")(h, cos_sin, kv, md)
        x = x + h
        h = norm("post_attention_layernorm")(x)
        return x + GatedMLP(c, self.dtype, name="mlp")(h), kv


class EagleHead(nn.Module):
    """``__call__``: one pass of the head over a ragged batch ->
    (features [T, D], kv_pages); ``combine``: the target's tapped hidden
    states -> features; ``draft_ids``: features -> greedy target token
    ids."""
    ec: EagleConfig
    target_tied: bool  # eagle: the target's lm_head is its embedding table
    backend: str = "reference"
    dtype: jnp.dtype = jnp.float32

    def setup(self) -> None:
        ec, D = self.ec, self.ec.cfg.hidden_size
        self.table = self.variable(
            "constants", ROPE_TABLE,
            lambda: jnp.zeros((1, ec.cfg.head_dim), jnp.float32))
        self.embedding = param(self, "embedding", (ec.cfg.vocab_size, D),
                               ("vocab", "embed"), self.dtype)
        width = 2 * D if ec.method == "eagle" else ec.tap_width
        self.fc = param(self, "fc", (width, D), ("mlp", "embed"), self.dtype)
        if ec.fc_bias:
            self.fc_bias = param(self, "fc_bias", (D,), ("embed",), self.dtype)
        self.layer = EagleLayer(ec, self.backend, self.dtype)
        if ec.method == "eagle3":
            self.norm = RMSNorm(D, ec.cfg.rms_norm_eps, self.dtype)
            self.d2t = param(self, "d2t", (ec.draft_vocab_size,), ("vocab",),
                             jnp.int32, nn.initializers.zeros)
        # EAGLE-1 shares the target's head: [V, D] when the target ties it
        # to its embeddings, else [D, V].
        shape = (D, ec.draft_vocab_size)
        if ec.method == "eagle" and self.target_tied:
            shape = shape[::-1]
        self.lm_head = param(self, "lm_head", shape, ("embed", "vocab"),
                             self.dtype)

    def constants(self, max_model_len: int) -> dict[str, np.ndarray]:
        return {ROPE_TABLE: rope_cos_sin_table(self.ec.cfg, max_model_len)}

    def combine(self, hidden: jax.Array) -> jax.Array:
        """[T, tap_width] target hidden states -> [T, D] features (EAGLE-3:
        its fc; EAGLE-1 reads them as they are)."""
        if self.ec.method == "eagle":
            return hidden
        return hidden.astype(self.dtype) @ self.fc

    def __call__(self, input_ids: jax.Array, positions: jax.Array,
                 kv_pages: list, md: AttentionMetadata, features: jax.Array
                 ) -> tuple[jax.Array, list]:
        embeds = jnp.take(self.embedding, input_ids, axis=0)
        cos_sin = jnp.take(self.table.value, positions, axis=0)
        x = features.astype(self.dtype)
        if self.ec.method == "eagle":
            x = jnp.concatenate([embeds, x], -1) @ self.fc
            if self.ec.fc_bias:
                x = x + self.fc_bias
        x, kv = self.layer(x, embeds, cos_sin, kv_pages[0], md)
        return x, [kv]

    def draft_ids(self, features: jax.Array) -> jax.Array:
        """[T, D] -> [T] int32: the greedy draft of each row, a target id."""
        if self.ec.method == "eagle3":
            ids = jnp.argmax(self.norm(features) @ self.lm_head, axis=-1)
            return (ids + self.d2t[ids]).astype(jnp.int32)
        logits = (rows_times_table(features, self.lm_head)
                  if self.target_tied else features @ self.lm_head)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


# -- checkpoint names -------------------------------------------------------

def head_weights(ec: EagleConfig) -> Iterator[WeightSpec]:
    """Every tensor of the head's checkpoint and where it lands (the shared
    embedding and lm_head come from the target instead when absent)."""
    c, D = ec.cfg, ec.cfg.hidden_size
    eagle3 = ec.method == "eagle3"
    hf = "midlayer." if eagle3 else "layers.0."
    p = ("layer",)
    width = ec.tap_width if eagle3 else 2 * D
    yield WeightSpec("fc.weight", ("fc",), (D, width), linear_from_hf((D,), (width,)))
    if ec.fc_bias:
        yield WeightSpec("fc.bias", ("fc_bias",), (D,))
    if ec.own_embedding:
        yield WeightSpec("embed_tokens.weight", ("embedding",),
                         (c.vocab_size, D))
    yield WeightSpec(hf + "post_attention_layernorm.weight",
                     p + ("post_attention_layernorm", "scale"), (D,))
    if eagle3:
        for name in ("input_layernorm", "hidden_norm"):
            yield WeightSpec(hf + f"{name}.weight", p + (name, "scale"), (D,))
        N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
        for name, heads in (("q_proj", N), ("k_proj", K), ("v_proj", K)):
            yield WeightSpec(hf + f"self_attn.{name}.weight",
                             p + ("self_attn", name, "kernel"),
                             (heads * H, 2 * D),
                             linear_from_hf((heads, H), (2 * D,)))
            if c.attention_bias:
                yield WeightSpec(hf + f"self_attn.{name}.bias",
                                 p + ("self_attn", name, "bias"),
                                 (heads * H,), reshape_to((heads, H)))
        yield from (s for s in attention_weights(c, hf + "self_attn.",
                                                 p + ("self_attn",))
                    if s.path[-2] not in ("q_proj", "k_proj", "v_proj"))
        yield WeightSpec("norm.weight", ("norm", "scale"), (D,))
        yield WeightSpec("lm_head.weight", ("lm_head",),
                         (ec.draft_vocab_size, D), lambda w: np.asarray(w).T)
        yield WeightSpec("d2t", ("d2t",), (ec.draft_vocab_size,),
                         lambda w: np.asarray(w).astype(np.int32),
                         dtype=jnp.int32)
    else:
        yield from attention_weights(c, hf + "self_attn.", p + ("self_attn",))
    yield from GatedMLP.weights(c, hf + "mlp.", p + ("mlp",))


# Tensors a checkpoint may hold that drafting does not read: EAGLE-3's
# target -> draft vocabulary mask (only d2t maps ids).
NOT_NEEDED = ("t2d",)


def read_head_weights(ec: EagleConfig, get: Callable[[str], Any],
                      names: set[str], source: str,
                      put: Callable[..., None]) -> None:
    """Reads every tensor ``head_weights`` names through ``get(name)``,
    checks its shape and hands (path, array, dtype or None) to ``put``.
    A tensor of ``names`` that no spec reads is an error too, so a head of
    another layout is not half loaded."""
    specs = list(head_weights(ec))
    unused = sorted(names - {s.hf_name for s in specs} - set(NOT_NEEDED))
    if unused:
        raise CheckpointError(
            f"{source}: tensors {unused} are not part of an {ec.method} head "
            f"({ec.method == 'eagle' and 'EAGLE-1' or 'EAGLE-3'} layout)")
    for spec in specs:
        w = get(spec.hf_name)
        check_shape(spec, w, source, f"an {ec.method} head")
        put(spec.path, spec.convert(w), spec.dtype)
