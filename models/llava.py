"""LLaVA (1.5 layout): a CLIP vision tower, a two-layer projector, and a
Llama-family decoder, with the spec that registers
``LlavaForConditionalGeneration``.

An image is encoded once (``encode_images``: tower -> the hidden states of
``vision_feature_layer`` -> CLS dropped under the ``default`` select
strategy -> projector) into ``tokens_per_image`` embeddings of the
decoder's width; the engine writes them over the embeddings of the
image's placeholder tokens and runs the decoder on ``inputs_embeds``.
``__call__`` is the decoder's, so the paged path is the text model's own.

Param tree: ``language_model`` (the decoder's params, as
``LlamaForCausalLM`` names them), ``vision_tower``,
``multi_modal_projector``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from .attention import AttentionMetadata
from .clip import (
    VISION_ACTIVATIONS,
    CLIPVisionTower,
    VisionConfig,
    hidden_state_indices,
    vision_config_from_hf,
    vision_tower_weights,
)
from .config import ImageInput, ModelConfig
from .errors import ModelConfigError
from .layers import Linear
from .llama import ROPE_TABLE, LlamaForCausalLM, decoder_weights
from .rope import rope_cos_sin_table
from .spec import ModelSpec, WeightSpec, keep_layout, linear_from_hf

ARCHITECTURE = "LlavaForConditionalGeneration"

# Text models LLaVA checkpoints pair with the tower, by HF model_type: all
# are the Llama module with their family's config choices.
TEXT_ARCHITECTURES = {"llama": "LlamaForCausalLM",
                      "mistral": "MistralForCausalLM",
                      "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM"}
SELECT_STRATEGIES = ("default", "full")


@dataclasses.dataclass(frozen=True)
class LlavaConfig(ModelConfig):
    """The decoder's fields (inherited, so the engine sizes pages and
    batches from them) plus the tower and projector."""
    vision: VisionConfig | None = None
    image_token_index: int = -1  # the placeholder token id
    # HF's vision_feature_layer (one index or several, concatenated).
    vision_feature_layers: tuple[int, ...] = (-2,)
    vision_feature_select_strategy: str = "default"  # "full" keeps CLS
    projector_hidden_act: str = "gelu"
    projector_bias: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vision is None:
            raise ModelConfigError("a LLaVA config needs its vision_config")
        if not 0 <= self.image_token_index:
            raise ModelConfigError(
                f"image_token_index must be a token id, got "
                f"{self.image_token_index}")
        if self.vision_feature_select_strategy not in SELECT_STRATEGIES:
            raise ModelConfigError(
                f"vision_feature_select_strategy "
                f"{self.vision_feature_select_strategy!r} is not one of "
                f"{', '.join(SELECT_STRATEGIES)}")
        if self.projector_hidden_act not in VISION_ACTIVATIONS:
            raise ModelConfigError(
                f"projector_hidden_act {self.projector_hidden_act!r} is not "
                f"supported; supported: {', '.join(VISION_ACTIVATIONS)}")
        _ = self.feature_layers  # raises for a layer outside the tower

    @property
    def tower(self) -> VisionConfig:
        """The vision tower's config (never None once constructed)."""
        if self.vision is None:
            raise ModelConfigError("a LLaVA config needs its vision_config")
        return self.vision

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The tower's hidden states the projector reads (HF indices, 0 =
        the embeddings)."""
        return hidden_state_indices(self.vision_feature_layers,
                                    self.tower.num_layers)

    @property
    def tokens_per_image(self) -> int:
        cls = 1 if self.vision_feature_select_strategy == "full" else 0
        return self.tower.num_patches + cls

    @property
    def image_input(self) -> ImageInput:
        return ImageInput(self.image_token_index, self.tokens_per_image,
                          self.tower.image_size, self.tower.num_channels)


def llava_config_from_hf(hf: dict[str, Any]) -> LlavaConfig:
    # LLaVA checkpoints often write only the sub-config fields that differ
    # from HF's defaults (llava-1.5's text_config has no hidden_size):
    # transformers' own config class fills them in.
    from transformers import LlavaConfig as HFLlavaConfig

    from .registry import model_spec
    try:
        full = HFLlavaConfig.from_dict(hf).to_dict()
    except Exception as e:
        raise ModelConfigError(f"malformed LLaVA config.json: {e}") from e
    text = dict(full["text_config"])
    family = TEXT_ARCHITECTURES.get(text.get("model_type", ""))
    if family is None:
        raise ModelConfigError(
            f"LLaVA text model {text.get('model_type')!r} is not supported; "
            f"supported: {', '.join(TEXT_ARCHITECTURES)}")
    if not (text.get("torch_dtype") or text.get("dtype")):
        text["dtype"] = hf.get("torch_dtype") or hf.get("dtype")
    base = model_spec(family).config_from_hf(text)
    fields = {f.name: getattr(base, f.name)
              for f in dataclasses.fields(ModelConfig)}
    fields.update(architecture=ARCHITECTURE,
                  tie_word_embeddings=bool(full.get("tie_word_embeddings")))
    layer = full.get("vision_feature_layer", -2)
    layers = (layer,) if isinstance(layer, int) else tuple(layer)
    return LlavaConfig(
        **fields,
        vision=vision_config_from_hf(full["vision_config"]),
        image_token_index=int(full.get("image_token_index",
                                       full.get("image_token_id", -1))),
        vision_feature_layers=tuple(int(i) for i in layers),
        vision_feature_select_strategy=full.get(
            "vision_feature_select_strategy", "default"),
        projector_hidden_act=full.get("projector_hidden_act", "gelu"),
        projector_bias=bool(full.get("multimodal_projector_bias", True)))


class MultiModalProjector(nn.Module):
    """[B, P, Dv * layers] -> [B, P, D]: linear, activation, linear."""
    cfg: LlavaConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        d_in = c.tower.hidden_size * len(c.feature_layers)
        D = c.hidden_size
        h = Linear((d_in,), (D,), ("embed", "mlp"), c.projector_bias,
                   self.dtype, name="linear_1")(x)
        h = VISION_ACTIVATIONS[c.projector_hidden_act](h)
        return Linear((D,), (D,), ("mlp", "embed"), c.projector_bias,
                      self.dtype, name="linear_2")(h)


class LlavaForConditionalGeneration(nn.Module):
    """``__call__`` is the decoder's (the model contract); images enter as
    ``inputs_embeds`` built from ``encode_images`` and ``embed``."""
    cfg: LlavaConfig
    backend: str = "reference"
    dtype: Any = jnp.float32
    mesh: Any = None

    def setup(self) -> None:
        c = self.cfg
        self.language_model = LlamaForCausalLM(c, self.backend, self.dtype,
                                               self.mesh)
        self.vision_tower = CLIPVisionTower(c.tower, self.dtype,
                                            c.feature_layers)
        self.multi_modal_projector = MultiModalProjector(c, self.dtype)

    def constants(self, max_model_len: int) -> dict:
        return {"language_model": {
            ROPE_TABLE: rope_cos_sin_table(self.cfg, max_model_len)}}

    def embed(self, input_ids: jax.Array) -> jax.Array:  # [T] int32 -> [T, D]
        return self.language_model.embed(input_ids)

    def encode_images(self, pixel_values: jax.Array  # [B, C, S, S]
                      ) -> jax.Array:  # [B, tokens, D]
        states = self.vision_tower(pixel_values)
        if self.cfg.vision_feature_select_strategy == "default":
            states = [s[:, 1:] for s in states]  # drop the class token
        return self.multi_modal_projector(jnp.concatenate(states, axis=-1))

    def __call__(
        self,
        input_ids: jax.Array,  # [T] int32
        positions: jax.Array,  # [T] int32
        kv_pages: list[tuple[jax.Array, ...]],  # L (k_pages, v_pages[, scales])
        md: AttentionMetadata,
        logits_indices: jax.Array,  # [S] int32
        inputs_embeds: jax.Array | None = None,  # [T, D]
    ) -> tuple[jax.Array, list[tuple[jax.Array, ...]]]:  # logits [S, V], pages
        if self.is_initializing():  # create the tower's params as well
            v = self.cfg.tower
            self.encode_images(jnp.zeros(
                (1, v.num_channels, v.image_size, v.image_size), jnp.float32))
        return self.language_model(input_ids, positions, kv_pages, md,
                                   logits_indices, inputs_embeds=inputs_embeds)


# -- checkpoint names -------------------------------------------------------
# The names transformers 5 writes (save_pretrained of
# LlavaForConditionalGeneration); as aliases, those of hub checkpoints saved
# by transformers 4 (``vision_tower.vision_model.``) and the module paths of
# transformers 5 (``model.language_model.``, ``lm_head``).

def llava_weights(cfg: ModelConfig) -> Iterator[WeightSpec]:
    if not isinstance(cfg, LlavaConfig):
        raise TypeError(f"LLaVA weights need a LlavaConfig, got "
                        f"{type(cfg).__name__}")
    for w in decoder_weights(cfg):
        if w.hf_name.startswith("model."):
            rest = w.hf_name[len("model."):]
            name, aliases = f"language_model.{w.hf_name}", (
                f"model.language_model.{rest}",)
        else:  # lm_head.weight
            name, aliases = f"language_model.{w.hf_name}", (w.hf_name,)
        yield dataclasses.replace(w, hf_name=name, aliases=aliases,
                                  path=("language_model",) + w.path)
    for w in vision_tower_weights(cfg.tower, max(cfg.feature_layers)):
        rest = w.hf_name
        yield dataclasses.replace(
            w, hf_name=f"vision_tower.{rest}", path=("vision_tower",) + w.path,
            aliases=(f"vision_tower.vision_model.{rest}",
                     f"model.vision_tower.{rest}",
                     f"model.vision_tower.vision_model.{rest}"))
    D = cfg.hidden_size
    d_in = cfg.tower.hidden_size * len(cfg.feature_layers)
    for name, out_dim, in_dim in (("linear_1", D, d_in), ("linear_2", D, D)):
        hf = f"multi_modal_projector.{name}"
        path = ("multi_modal_projector", name)
        yield WeightSpec(f"{hf}.weight", path + ("kernel",), (out_dim, in_dim),
                         linear_from_hf((out_dim,), (in_dim,)),
                         aliases=(f"model.{hf}.weight",))
        if cfg.projector_bias:
            yield WeightSpec(f"{hf}.bias", path + ("bias",), (out_dim,),
                             keep_layout, aliases=(f"model.{hf}.bias",))


SPECS = (ModelSpec(architecture=ARCHITECTURE,
                   model=LlavaForConditionalGeneration,
                   config_from_hf=llava_config_from_hf, weights=llava_weights),)

