"""A prompt's images -> pixel values and placeholder ranges, with the
checkpoint's own image processor.

The prompt holds one image token per image (the text ``<image>``, or the
id itself in ``prompt_token_ids``); each becomes ``tokens_per_image``
copies, whose embeddings the encoder's outputs replace (vLLM's prompt
replacement; a prompt whose placeholders are expanded already is taken as
is). Preprocessing is transformers' image processor loaded from the
model's ``preprocessor_config.json`` (resize, center crop, rescale,
normalize as that file says), run on the request's worker thread, before
the engine loop.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import numpy as np

from jaxinfer.models.config import ImageInput
from jaxinfer.models.errors import CheckpointError

from ..errors import InvalidRequestError
from .inputs import MultiModalInput
from .limits import limit_for
from .media import check_images, image_hash

logger = logging.getLogger(__name__)

# Where a model folder keeps its image processor's settings: its own file
# (hub checkpoints), or a section of the processor's (transformers 5).
PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_FILES = (PREPROCESSOR_CONFIG, "processor_config.json")


def load_hf_image_processor(model_dir: str):
    """transformers' image processor of a model folder (the class its
    config names, in the backend this transformers has)."""
    if not any(os.path.isfile(os.path.join(model_dir, f))
               for f in PROCESSOR_FILES):
        raise CheckpointError(
            f"{model_dir} has neither {' nor '.join(PROCESSOR_FILES)}: a "
            "model that takes images needs its image processor's settings "
            "(LLaVA checkpoints ship them)")
    from transformers import AutoImageProcessor
    try:
        return AutoImageProcessor.from_pretrained(model_dir,
                                                  local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"{model_dir}: the image processor could not "
                              f"be loaded: {e}") from e


@dataclasses.dataclass
class ImageProcessor:
    """Turns the images of one prompt into `MultiModalInput`s."""
    hf_processor: Any  # transformers' image processor
    spec: ImageInput  # the model's placeholder id, tokens and pixels per image
    limits: dict[str, int]  # limit_mm_per_prompt
    placeholder: str = "<image>"  # the token's text, for chat messages
    # The engine's context length (set by the InputProcessor): images whose
    # placeholders alone cannot fit it are refused before they are read.
    max_model_len: int | None = None

    @classmethod
    def for_model(cls, model_dir: str, spec: ImageInput, limits: dict[str, int],
                  tokenizer=None) -> ImageProcessor:
        proc = cls(load_hf_image_processor(model_dir), spec, limits)
        if tokenizer is not None:
            text = tokenizer.convert_ids_to_tokens(spec.token_id)
            if isinstance(text, str) and text:
                proc.placeholder = text
        proc._check_output_size()
        return proc

    def _check_output_size(self) -> None:
        """The processor must produce the tower's input size; a mismatched
        preprocessor_config.json is a checkpoint error at load, not a
        failure of every request."""
        from PIL import Image
        probe = Image.new("RGB", (2 * self.spec.image_size,
                                  self.spec.image_size))
        got = self._pixels([probe])[0].shape
        S = self.spec.image_size
        if tuple(got[-2:]) != (S, S):
            raise CheckpointError(
                f"the image processor ({type(self.hf_processor).__name__}) makes "
                f"{got[-2]} x {got[-1]} pixel inputs, but the vision tower "
                f"takes {S} x {S}: check its size and crop_size")

    def _pixels(self, images: list) -> list[np.ndarray]:
        out = self.hf_processor(images=images, return_tensors="np")
        return [np.asarray(p, np.float32) for p in out["pixel_values"]]

    @property
    def max_images(self) -> int:
        return limit_for(self.limits, "image")

    def check_count(self, n: int) -> None:
        """Refuses ``n`` images over limit_mm_per_prompt, or more than the
        context holds (each takes tokens_per_image tokens and the prompt
        needs room for one more token): checked before any is decoded."""
        if n > self.max_images:
            raise InvalidRequestError(
                f"At most {self.max_images} image(s) may be provided in one "
                f"prompt, got {n}: send fewer, or raise limit_mm_per_prompt "
                f"(--limit-mm-per-prompt '{{\"image\": {n}}}')")
        N = self.spec.tokens_per_image
        if self.max_model_len is not None and n * N >= self.max_model_len:
            fit = (self.max_model_len - 1) // N
            raise InvalidRequestError(
                f"{n} image(s) take {n * N} tokens ({N} each), but "
                f"max_model_len is {self.max_model_len}: at most {fit} "
                "fit in one prompt; send fewer")

    def images_of(self, data: Any) -> list:
        """``multi_modal_data`` -> its checked images (PIL, in order)."""
        if not isinstance(data, dict):
            raise InvalidRequestError(
                f"multi_modal_data must be a dict such as {{'image': "
                f"<PIL.Image>}}, got {type(data).__name__}")
        other = sorted(set(data) - {"image"})
        if other:
            raise InvalidRequestError(
                f"multi_modal_data holds {', '.join(map(repr, other))}; this "
                "model takes images only ('image')")
        images = data.get("image")
        if images is None:
            return []
        if not isinstance(images, (list, tuple)):
            images = [images]
        self.check_count(len(images))
        return check_images(list(images), [f"multi_modal_data['image'][{i}]"
                                           for i in range(len(images))])

    def expand(self, ids: list[int], num_images: int
               ) -> tuple[list[int], list[int]]:
        """(ids with each image's placeholder repeated tokens_per_image
        times, the position where each image's placeholders start)."""
        token, N = self.spec.token_id, self.spec.tokens_per_image
        where = [i for i, t in enumerate(ids) if t == token]
        if not num_images:
            if where:
                raise InvalidRequestError(
                    f"the prompt holds {len(where)} image placeholder "
                    f"token(s) ({self.placeholder!r}, id {token}) but no image "
                    "was given: pass them in multi_modal_data={'image': ...} "
                    "or remove the placeholders")
            return ids, []
        n = num_images
        if len(where) == n:  # one placeholder per image: expand each
            starts, out, prev = [], [], 0
            for pos in where:
                out.extend(ids[prev:pos])
                starts.append(len(out))
                out.extend([token] * N)
                prev = pos + 1
            out.extend(ids[prev:])
            return out, starts
        if len(where) == n * N and all(
                where[k * N + N - 1] - where[k * N] == N - 1 for k in range(n)):
            return list(ids), where[::N]  # expanded already
        raise InvalidRequestError(
            f"the prompt holds {len(where)} image placeholder token(s) "
            f"({self.placeholder!r}) for {n} image(s): give one placeholder "
            "per image, where each image goes")

    def process(self, ids: list[int], data: Any
                ) -> tuple[list[int], tuple[MultiModalInput, ...]]:
        """(prompt ids with every image's placeholders expanded, the
        images as MultiModalInputs in prompt order)."""
        images = self.images_of(data) if data is not None else []
        out, starts = self.expand(ids, len(images))
        if not images:
            return out, ()
        try:
            pixels = self._pixels(images)
        except Exception as e:  # noqa: BLE001 - the image was the problem
            raise InvalidRequestError(
                f"an image could not be preprocessed: {e}") from None
        N = self.spec.tokens_per_image
        return out, tuple(
            MultiModalInput(p, image_hash(img), start, N)
            for p, img, start in zip(pixels, images, starts))

def make_image_processor(files, args, tokenizer) -> ImageProcessor | None:
    """The engine's image processor, None for a text-only model (whose
    limit_mm_per_prompt then limits nothing: said once, in the log)."""
    spec = files.config.image_input
    if spec is None:
        if args.limit_mm_per_prompt.get("image"):
            logger.warning("limit_mm_per_prompt=%s has no effect: %s takes "
                           "text only", args.limit_mm_per_prompt,
                           files.config.architecture)
        return None
    return ImageProcessor.for_model(files.source, spec, args.limit_mm_per_prompt,
                                    tokenizer)
