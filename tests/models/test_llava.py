"""LLaVA against HF transformers (torch, float32) on tiny random configs:
the vision tower's features, the projected image embeddings and the full
model's logits with an image, within 1e-4; the weight list against the
module; checkpoints under the other transformers versions' names; and a
partial hub-style config.json filled in as HF fills it."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.tiny_llava import IMAGE_TOKEN_ID, TOKENS_PER_IMAGE, make_tiny_llava

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_llava_path):
    """{name: folder}: the default tiny LLaVA, and one reading two layers
    (one of them the last) with the class token kept."""
    root = tmp_path_factory.mktemp("llava")
    return {
        "default": tiny_llava_path,
        "multi-layer-full": make_tiny_llava(
            str(root / "multi"), seed=1, vision_feature_layer=[-3, -1],
            vision_feature_select_strategy="full"),
    }


def _ours(path):
    from jaxinfer.models import load_params, model_class, resolve_model
    files = resolve_model(path)
    model = model_class(files.config.architecture)(files.config)
    return model, load_params(files, jnp.float32)


def _hf(path):
    import torch
    from transformers import LlavaForConditionalGeneration
    torch.set_num_threads(1)
    return LlavaForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, local_files_only=True).eval()


def _pixels(n, seed=0):
    return np.random.RandomState(seed).randn(n, 3, 56, 56).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "multi-layer-full"])
def test_vision_features_match_hf(checkpoints, name):
    import torch
    path = checkpoints[name]
    model, params = _ours(path)
    hf = _hf(path)
    cfg = model.cfg
    px = _pixels(3)
    with torch.no_grad():
        states = hf.model.vision_tower(torch.tensor(px),
                                       output_hidden_states=True).hidden_states
        want = hf.model.get_image_features(
            torch.tensor(px), vision_feature_layer=hf.config.vision_feature_layer,
            vision_feature_select_strategy=hf.config.vision_feature_select_strategy
        ).pooler_output
    ours = model.bind({"params": params}).vision_tower(jnp.asarray(px))
    for layer, got in zip(cfg.feature_layers, ours):
        np.testing.assert_allclose(np.asarray(got), states[layer].numpy(),
                                   atol=ATOL, rtol=0)
    got = model.apply({"params": params}, px, method="encode_images")
    want = torch.stack(list(want)).numpy()
    assert got.shape == (3, cfg.tokens_per_image, cfg.hidden_size)
    assert cfg.tokens_per_image == TOKENS_PER_IMAGE + (name != "default")
    np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_logits_with_an_image_match_hf(checkpoints):
    """The decoder over token embeddings whose placeholder rows are the
    image's embeddings (what the engine's step builds), against HF's
    forward with pixel_values, at every position."""
    import torch

    from jaxinfer.models import embed_tokens, run_model
    from jaxinfer.pallas_kernels import init_kv_pages
    from tests.models.forward import pack
    path = checkpoints["default"]
    model, params = _ours(path)
    cfg = model.cfg
    ids = ([5, 17, 900] + [IMAGE_TOKEN_ID] * TOKENS_PER_IMAGE
           + [4000, 31, 7, 12000, 2])
    px = _pixels(1, seed=3)
    hf = _hf(path)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([ids]),
                  pixel_values=torch.tensor(px)).logits[0].numpy()
    image = model.apply({"params": params}, px, method="encode_images")[0]
    embeds = embed_tokens(model, params, jnp.asarray(ids, jnp.int32))
    at = ids.index(IMAGE_TOKEN_ID)
    embeds = embeds.at[at:at + TOKENS_PER_IMAGE].set(image)
    B = 16
    pages = -(-len(ids) // B)
    input_ids, positions, md, _ = pack([(ids, 0, list(range(1, pages + 1)))], B)
    kv = init_kv_pages(cfg.num_layers, pages + 1, B, cfg.num_kv_heads,
                       cfg.head_dim, jnp.float32)
    from jaxinfer.models.runtime import model_constants
    logits, _ = jax.jit(lambda *a: run_model(model, *a))(
        params, model_constants(model, 128), kv, input_ids, positions, md,
        np.arange(len(ids), dtype=np.int32), embeds)
    np.testing.assert_allclose(np.asarray(logits), want, atol=ATOL, rtol=0)
    # The image matters: the same tokens with another image score otherwise.
    other = model.apply({"params": params}, _pixels(1, seed=4),
                        method="encode_images")[0]
    assert float(jnp.abs(other - image).max()) > 1e-2


def test_weight_list_fills_the_module(checkpoints):
    from jaxinfer.models import model_spec, resolve_model
    from jaxinfer.models.abstract import abstract_variables
    from jaxinfer.models.spec import verify_weights
    for path in checkpoints.values():
        files = resolve_model(path)
        cfg = files.config
        model, _ = _ours(path)
        verify_weights(model_spec(cfg.architecture), cfg,
                       nn.unbox(abstract_variables(model, cfg)["params"]))
        names = {w.hf_name for w in model_spec(cfg.architecture).weights(cfg)}
        # The default reads layer -2: the tower's last layer (and its
        # post_layernorm) is never computed, so never loaded.
        last = cfg.vision.num_layers - 1
        used = f"vision_tower.encoder.layers.{last}.mlp.fc1.weight" in names
        assert used == (max(cfg.feature_layers) == cfg.vision.num_layers)
        assert not any("post_layernorm" in n for n in names)


def test_hub_and_module_names_load_the_same_params(checkpoints, tmp_path):
    """transformers 4 wrote ``vision_tower.vision_model.*``; transformers 5
    modules are ``model.language_model.*`` / ``lm_head``: both load."""
    from safetensors.numpy import load_file, save_file
    src = checkpoints["default"]
    tensors = load_file(os.path.join(src, "model.safetensors"))
    renamed = {}
    for k, v in tensors.items():
        if k.startswith("vision_tower."):
            k = "vision_tower.vision_model." + k[len("vision_tower."):]
        elif k.startswith("language_model.model."):
            k = "model.language_model." + k[len("language_model.model."):]
        elif k == "language_model.lm_head.weight":
            k = "lm_head.weight"
        renamed[k] = v
    assert renamed.keys() != tensors.keys()
    save_file(renamed, str(tmp_path / "model.safetensors"))
    for f in os.listdir(src):
        if f.endswith(".json") or f.endswith(".jinja"):
            with open(os.path.join(src, f)) as a, open(tmp_path / f, "w") as b:
                b.write(a.read())
    _, want = _ours(src)
    _, got = _ours(str(tmp_path))
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)


def test_a_partial_hub_config_is_completed_as_hf_completes_it(tmp_path):
    """llava-1.5-7b-hf's config.json names a few sub-config fields; HF's
    defaults (a 4096-wide, 32-layer Llama) fill in the rest."""
    from jaxinfer.models import model_config_from_hf
    from jaxinfer.models.config import ImageInput
    cfg = model_config_from_hf({
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava", "image_token_index": 32000,
        "projector_hidden_act": "gelu", "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default", "torch_dtype": "float16",
        "text_config": {"model_type": "llama", "vocab_size": 32064,
                        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
                          "image_size": 336, "intermediate_size": 4096,
                          "num_attention_heads": 16, "num_hidden_layers": 24,
                          "patch_size": 14, "projection_dim": 768}})
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.vocab_size) == (
        4096, 32, 32, 32064)
    assert cfg.dtype == "float16" and cfg.vision.hidden_act == "quick_gelu"
    assert cfg.image_input == ImageInput(32000, 576, 336, 3)
    assert cfg.feature_layers == (23,)


def test_bad_llava_configs_name_the_field():
    from jaxinfer.models import ModelConfigError, model_config_from_hf
    base = json.loads(json.dumps({
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "image_token_index": 5, "text_config": {"model_type": "llama"},
        "vision_config": {"model_type": "clip_vision_model"}}))
    for change, field in [({"vision_feature_select_strategy": "cls"},
                           "vision_feature_select_strategy"),
                          ({"vision_feature_layer": 30}, "vision_feature_layer"),
                          ({"text_config": {"model_type": "gpt2"}}, "gpt2")]:
        with pytest.raises(ModelConfigError, match=field):
            model_config_from_hf({**base, **change})
