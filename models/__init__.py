"""Flax model definitions and checkpoint loaders (``jaxinfer.models``)."""

# One module identity per file: this folder is the package ``jaxinfer.models``
# (reached through the ``jaxinfer/models`` link). Imported as a top-level
# ``models`` (from the repo root, say) every class would exist twice and
# ``except`` clauses would miss half the errors, so that name is refused.
if __name__ != "jaxinfer.models":
    raise ImportError(f"import jaxinfer.models, not {__name__}: the folder "
                      "models/ is installed as jaxinfer.models")

import importlib
from typing import TYPE_CHECKING

# Names are imported on first use (PEP 562): a process that only reads a
# model's config or tokenizer (an HTTP front end) never imports JAX.
_EXPORTS = {
    "attention": ("AttentionMetadata", "paged_attention", "resolve_backend"),
    "config": ("ModelConfig", "RopeScaling", "model_config_from_hf"),
    "embedded": ("DEFAULT_MODEL", "EMBEDDED_MODELS"),
    "errors": ("CheckpointError", "MissingWeightError", "ModelConfigError",
               "ShapeMismatchError"),
    "loader": ("ModelFiles", "load_params", "resolve_dtype", "resolve_model",
               "resolve_tokenizer"),
    "tokenizer_source": ("TokenizerSource",),
    "registry": ("model_class", "model_spec", "register_model",
                 "supported_architectures"),
    "rope": ("rope_cos_sin_table",),
    "runtime": ("embed_tokens", "model_constants", "run_model"),
    "spec": ("GGUFNames", "ModelContractError", "ModelSpec", "WeightSpec"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items()
              for name in names}

if TYPE_CHECKING:
    from .attention import AttentionMetadata, paged_attention, resolve_backend
    from .config import ModelConfig, RopeScaling, model_config_from_hf
    from .embedded import DEFAULT_MODEL, EMBEDDED_MODELS
    from .errors import CheckpointError, MissingWeightError, ModelConfigError, ShapeMismatchError
    from .loader import ModelFiles, load_params, resolve_dtype, resolve_model, resolve_tokenizer
    from .registry import model_class, model_spec, register_model, supported_architectures
    from .rope import rope_cos_sin_table
    from .runtime import embed_tokens, model_constants, run_model
    from .spec import GGUFNames, ModelContractError, ModelSpec, WeightSpec
    from .tokenizer_source import TokenizerSource


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxinfer.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AttentionMetadata", "paged_attention", "resolve_backend", "ModelConfig",
    "RopeScaling", "model_config_from_hf", "DEFAULT_MODEL", "EMBEDDED_MODELS",
    "CheckpointError", "MissingWeightError", "ModelConfigError",
    "ShapeMismatchError", "ModelFiles", "TokenizerSource", "load_params",
    "resolve_dtype", "resolve_model", "resolve_tokenizer", "model_class", "supported_architectures",
    "rope_cos_sin_table", "model_spec", "register_model", "embed_tokens",
    "model_constants", "run_model", "GGUFNames", "ModelContractError",
    "ModelSpec", "WeightSpec",
]
