"""One entry point from a model reference to (config, params, tokenizer)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from . import weight_cache
from .config import ModelConfig, load_hf_config, model_config_from_hf
from .embedded import embedded_model_path, is_embedded
from .errors import CheckpointError
from .gguf_loader import GGUFReader
from .orbax_checkpoint import is_orbax_model
from .safetensors_loader import SafetensorsReader
from .tokenizer_source import TokenizerSource
from .weights import build_params, checkpoint_names, weight_specs

logger = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
          "float16": jnp.float16}


class WeightReader(Protocol):
    """A checkpoint's tensors by HF name (None: the checkpoint lacks it)."""

    def get(self, hf_name: str, /) -> Any: ...


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """A resolved model reference."""
    config: ModelConfig
    tokenizer: TokenizerSource
    reader: WeightReader | None  # None for orbax and load_format="dummy"
    source: str
    hf_config: dict  # the HF-style config.json the config was built from
    format: str = "safetensors"  # "safetensors" | "gguf" | "orbax"


LOAD_FORMATS = ("auto", "dummy")


def resolve_model(model: str, load_format: str = "auto",
                  quantization: str | None = None) -> ModelFiles:
    """A local folder (HF safetensors), a .gguf file, or an embedded name.
    Nothing is downloaded. ``load_format="dummy"`` (vLLM's name) needs only
    the folder's config.json: the weights are random (see ``dummy.py``).
    ``quantization``: vLLM's argument; the config's ``quantization`` is
    what it and the checkpoint's own quantization resolve to
    (quantization/resolve.py)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, "
                         f"got {load_format!r}")
    path = embedded_model_path(model) if is_embedded(model) else model
    if os.path.isdir(path):
        hf = load_hf_config(path)
        cfg = model_config_from_hf(hf)
        if is_orbax_model(path):  # written by `jaxinfer convert`
            cfg = _quantized(cfg, quantization, hf, "orbax", path)
            return ModelFiles(cfg, TokenizerSource(path), None, path, hf, "orbax")
        reader = None if load_format == "dummy" else SafetensorsReader(path)
        cfg = _quantized(cfg, quantization, hf, "safetensors", path,
                         model_dir=path,
                         names=None if reader is None else reader.names())
        return ModelFiles(cfg, TokenizerSource(path), reader, path, hf)
    if os.path.isfile(path) and path.endswith(".gguf"):
        files = _resolve_gguf(path)
        if quantization is None:
            return files
        gguf = GGUFReader(path)  # the quantized blocks, not the cache's floats
        cfg = _quantized(files.config, quantization, files.hf_config, "gguf",
                         path, gguf_reader=gguf)
        return dataclasses.replace(files, config=cfg, reader=gguf)
    raise CheckpointError(
        f"model {model!r} is neither a local HF model folder, a .gguf file, "
        "nor an embedded model name (jaxinfer never downloads from a hub; "
        "the embedded default is 'smollm2-135m-instruct')")


def _quantized(cfg: ModelConfig, requested: str | None, hf: dict, fmt: str,
               source: str, **kw: Any) -> ModelConfig:
    from .quantization.resolve import resolve_quantization
    qc = resolve_quantization(requested, cfg, hf, fmt, source, **kw)
    return cfg if qc is None else dataclasses.replace(cfg, quantization=qc)


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


def _resolve_gguf(path: str) -> ModelFiles:
    """A GGUF file through its weight-cache entry (see weight_cache.py): on
    a hit the file is only hashed; on a miss (or with the cache off) it is
    parsed and dequantized, and the entry written for the next start."""
    directory, name = os.path.split(os.path.abspath(path))
    root = weight_cache.cache_root()
    cached = None
    if root is not None:
        digest = weight_cache.source_digest(path, root)
        entry = os.path.join(root, digest)
        if os.path.isdir(entry):
            try:
                cached = weight_cache.read_entry(entry, digest)
            except CheckpointError as e:
                logger.warning("the weight cache entry %s is unreadable (%s); "
                               "rebuilding it", entry, e)
        if cached is None:
            cached = _build_cache_entry(path, root, digest)
    if cached is not None:
        hf = cached.hf_config
        return ModelFiles(model_config_from_hf(hf),
                          TokenizerSource(directory, name, cached.directory),
                          cached, path, hf, "gguf")
    reader = GGUFReader(path)
    hf = reader.hf_config()
    return ModelFiles(model_config_from_hf(hf), TokenizerSource(directory, name),
                      reader, path, hf, "gguf")


def _build_cache_entry(path: str, root: str, digest: str
                       ) -> weight_cache.CachedWeights | None:
    """Converts the GGUF into a new cache entry; None (and the caller reads
    the GGUF directly) when the cache folder cannot be written."""
    logger.info("converting %s for the weight cache (first start of this "
                "file only)", path)
    reader = GGUFReader(path)
    hf = reader.hf_config()
    cfg = model_config_from_hf(hf)
    # Only the tensors the model needs, as the checkpoint names them (a
    # fused param's parts, which either layout reads); one missing is left
    # out here and named by build_params at load time.
    tensors = ((n, w) for n, w in
               ((name, reader.get(name)) for spec in weight_specs(cfg)
                for name in checkpoint_names(spec))
               if w is not None)
    try:
        entry = weight_cache.write_entry(root, digest, path, hf, tensors)
        weight_cache.remove_stale_entries(root, path, keep=digest)
        return weight_cache.read_entry(entry, digest)
    except (OSError, CheckpointError) as e:
        logger.warning("cannot use the weight cache at %s (%s); set %s to a "
                       "writable folder, or to '' to turn it off", root, e,
                       weight_cache.ENV_VAR)
        return None


def resolve_dtype(dtype: str, cfg: ModelConfig) -> jax.typing.DTypeLike:
    """vLLM's ``dtype``: auto takes the checkpoint's (float32 stays float32,
    GGUF dequantizes to float32)."""
    if dtype == "auto":
        dtype = cfg.dtype if cfg.dtype in DTYPES else "float32"
    dtype = {"half": "float16", "float": "float32"}.get(dtype, dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; "
                         f"got {dtype!r}")
    return DTYPES[dtype]


def load_params(files: ModelFiles, dtype: jax.typing.DTypeLike,
                place: Callable | None = None,
                elsewhere: Callable | None = None) -> dict:
    from .quantization.loading import linear_loader
    if files.reader is None:
        raise CheckpointError(
            f"{files.source}: no tensors to read (format {files.format!r}); "
            "orbax checkpoints are restored, dummy weights drawn")
    return build_params(files.config, files.reader.get, dtype, files.source,
                        place=place, elsewhere=elsewhere,
                        linear=linear_loader(files.config, files.reader))
