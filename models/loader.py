"""One entry point from a model reference to (config, params, tokenizer)."""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp

from .config import ModelConfig, load_hf_config, model_config_from_hf
from .embedded import embedded_model_path, is_embedded
from .errors import CheckpointError
from .gguf_loader import GGUFReader
from .orbax_checkpoint import is_orbax_model
from .safetensors_loader import SafetensorsReader
from .weights import build_params

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
          "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class TokenizerSource:
    """Where the tokenizer lives: an HF folder, or a GGUF file's metadata."""
    directory: str
    gguf_file: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """A resolved model reference."""
    config: ModelConfig
    tokenizer: TokenizerSource
    reader: object | None  # has .get(hf_name); None for orbax and load_format="dummy"
    source: str
    hf_config: dict  # the HF-style config.json the config was built from
    format: str = "safetensors"  # "safetensors" | "gguf" | "orbax"


LOAD_FORMATS = ("auto", "dummy")


def resolve_model(model: str, load_format: str = "auto") -> ModelFiles:
    """A local folder (HF safetensors), a .gguf file, or an embedded name.
    Nothing is downloaded. ``load_format="dummy"`` (vLLM's name) needs only
    the folder's config.json: the weights are random (see ``dummy.py``)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, "
                         f"got {load_format!r}")
    path = embedded_model_path(model) if is_embedded(model) else model
    if os.path.isdir(path):
        hf = load_hf_config(path)
        cfg = model_config_from_hf(hf)
        if is_orbax_model(path):  # written by `jaxinfer convert`
            return ModelFiles(cfg, TokenizerSource(path), None, path, hf, "orbax")
        reader = None if load_format == "dummy" else SafetensorsReader(path)
        return ModelFiles(cfg, TokenizerSource(path), reader, path, hf)
    if os.path.isfile(path) and path.endswith(".gguf"):
        reader = GGUFReader(path)
        hf = reader.hf_config()
        cfg = model_config_from_hf(hf)
        directory, name = os.path.split(os.path.abspath(path))
        return ModelFiles(cfg, TokenizerSource(directory, name), reader, path,
                          hf, "gguf")
    raise CheckpointError(
        f"model {model!r} is neither a local HF model folder, a .gguf file, "
        "nor an embedded model name (jaxinfer never downloads from a hub; "
        "the embedded default is 'smollm2-135m-instruct')")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def resolve_tokenizer(reference: str) -> TokenizerSource:
    """``--tokenizer``: a folder holding only tokenizer files (no
    config.json), or any model reference ``resolve_model`` takes."""
    path = embedded_model_path(reference) if is_embedded(reference) else reference
    if os.path.isdir(path) and not os.path.isfile(
            os.path.join(path, "config.json")):
        if any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
            return TokenizerSource(path)
        raise CheckpointError(
            f"tokenizer folder {reference!r} holds none of "
            f"{', '.join(_TOKENIZER_FILES)}")
    return resolve_model(reference, "dummy").tokenizer


def resolve_dtype(dtype: str, cfg: ModelConfig):
    """vLLM's ``dtype``: auto takes the checkpoint's (float32 stays float32,
    GGUF dequantizes to float32)."""
    if dtype == "auto":
        dtype = cfg.dtype if cfg.dtype in DTYPES else "float32"
    dtype = {"half": "float16", "float": "float32"}.get(dtype, dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; "
                         f"got {dtype!r}")
    return DTYPES[dtype]


def load_params(files: ModelFiles, dtype, place=None) -> dict:
    return build_params(files.config, files.reader.get, dtype, files.source,
                        place=place)
