"""A tiny random-weight LLaVA checkpoint, saved as transformers 5 saves one
(config.json, model.safetensors, tokenizer, preprocessor_config.json), for
tests against HF's LlavaForConditionalGeneration.

The text model is a tiny Llama over the embedded SmolLM2 tokenizer with one
added token, ``<image>`` (id 49152, the image_token_index); the vision tower
is a 3-layer CLIP ViT over 56 x 56 images in 14-pixel patches, so an image
is 16 tokens (the class token is dropped).
"""

from __future__ import annotations

import os

import torch

from tests.tiny_models import BASE, embedded_tokenizer

IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 49152
IMAGE_SIZE = 56
PATCH = 14
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
              projection_dim=16, hidden_act="quick_gelu")


def llava_tokenizer():
    tok = embedded_tokenizer()
    import copy
    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    assert tok.convert_tokens_to_ids(IMAGE_TOKEN) == IMAGE_TOKEN_ID
    return tok


def hf_llava_config(**overrides):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
    text = dict(BASE, vocab_size=IMAGE_TOKEN_ID + 1)
    kw = dict(vision_config=CLIPVisionConfig(**VISION),
              text_config=LlamaConfig(**text), image_token_index=IMAGE_TOKEN_ID,
              projector_hidden_act="gelu", vision_feature_layer=-2,
              vision_feature_select_strategy="default",
              image_seq_length=TOKENS_PER_IMAGE)
    kw.update(overrides)
    return LlavaConfig(**kw)


def make_tiny_llava(path: str, seed: int = 0, **overrides) -> str:
    """Saves a random-weight LLaVA (float32), its tokenizer and its image
    processor under path."""
    from transformers import CLIPImageProcessor, LlavaForConditionalGeneration, LlavaProcessor
    cfg = hf_llava_config(**overrides)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).to(torch.float32)
    # Larger-than-default init so that random models have peaked, decisive
    # distributions and the image visibly steers them.
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    size = cfg.vision_config.image_size
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    strategy = cfg.vision_feature_select_strategy
    LlavaProcessor(image_processor=image_processor, tokenizer=llava_tokenizer(),
                   patch_size=cfg.vision_config.patch_size,
                   vision_feature_select_strategy=strategy,
                   num_additional_image_tokens=1,
                   image_token=IMAGE_TOKEN).save_pretrained(path)
    return path


def random_image(seed: int, size=(40, 70)):
    """A random RGB PIL image (height, width)."""
    import numpy as np
    from PIL import Image
    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(*size, 3) * 255).astype(np.uint8))


class HfLlava:
    """HF transformers' LlavaForConditionalGeneration (float32) and the
    folder's own processor: greedy continuations, one prompt at a time."""

    def __init__(self, path: str):
        torch.set_num_threads(1)
        from transformers import AutoProcessor, LlavaForConditionalGeneration
        self.processor = AutoProcessor.from_pretrained(path,
                                                       local_files_only=True)
        self.model = LlavaForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32, local_files_only=True).eval()
        self.tokenizer = self.processor.tokenizer

    def generate_greedy(self, prompts, max_tokens: int):
        """prompts: (text, [images]) pairs -> [(new token ids, text)]."""
        outs = []
        for text, images in prompts:
            kwargs = {"images": images} if images else {}
            inputs = self.processor(text=text, return_tensors="pt", **kwargs)
            with torch.no_grad():
                seq = self.model.generate(**inputs, do_sample=False,
                                          max_new_tokens=max_tokens,
                                          pad_token_id=2)
            new = seq[0, inputs["input_ids"].shape[1]:].tolist()
            if 2 in new:
                new = new[:new.index(2) + 1]
            outs.append((new, self.tokenizer.decode(
                new, skip_special_tokens=True)))
        return outs
