"""How a pooling model pools: read from the model folder's
sentence-transformers files when it has them, else vLLM's defaults for a
decoder used as an embedder (last token, normalized).

sentence-transformers describes a model as a list of modules
(``modules.json``); its Pooling module's folder holds ``config.json`` with
one ``pooling_mode_*`` flag set, and a Normalize module, when listed, L2-
normalizes the pooled vector. Matryoshka models (whose leading values are an
embedding of their own) say so in the HF ``config.json``, which is what
allows a request's ``dimensions``.
"""

from __future__ import annotations

import dataclasses
import json
import os

from ..errors import InvalidConfigError, UnsupportedFeatureError

POOLING_TYPES = ("LAST", "MEAN", "CLS")
# sentence-transformers' pooling_mode_* flags -> our pooling type.
ST_MODES = {"pooling_mode_lasttoken": "LAST",
            "pooling_mode_mean_tokens": "MEAN",
            "pooling_mode_cls_token": "CLS"}
ST_UNSERVED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
               "pooling_mode_weightedmean_tokens")
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclasses.dataclass(frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"  # one of POOLING_TYPES
    normalize: bool = True  # the default when a request leaves it unset
    # Matryoshka: None -> no request may cut dimensions; () -> any cut;
    # otherwise the cuts the model was trained for.
    matryoshka_dimensions: tuple[int, ...] | None = None
    source: str = "vLLM's defaults for a decoder embedder"

    def __post_init__(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise InvalidConfigError(
                f"pooling_type must be one of {', '.join(POOLING_TYPES)}, "
                f"got {self.pooling_type!r}")

    @property
    def pools_every_token(self) -> bool:
        """Whether the pooled value reads positions before the last, so a
        prompt's cached prefix cannot be skipped."""
        return self.pooling_type != "LAST"


def pooler_config(model_dir: str | None) -> PoolerConfig:
    """The pooler of the model in ``model_dir`` (None, or a file such as a
    GGUF: the defaults)."""
    if model_dir is None or not os.path.isdir(model_dir):
        return PoolerConfig()
    matryoshka = _matryoshka(model_dir)
    modules = _read_json(os.path.join(model_dir, "modules.json"))
    if modules is None:
        return PoolerConfig(matryoshka_dimensions=matryoshka)
    if not isinstance(modules, list):
        raise InvalidConfigError(
            f"{model_dir}/modules.json must be a list of modules")
    pooling = next((m for m in modules if m.get("type") == ST_POOLING), None)
    normalize = any(m.get("type") == ST_NORMALIZE for m in modules)
    if pooling is None:
        return PoolerConfig(normalize=normalize, matryoshka_dimensions=matryoshka,
                            source=f"{model_dir}/modules.json")
    path = os.path.join(model_dir, pooling.get("path", ""), "config.json")
    cfg = _read_json(path)
    if cfg is None:
        raise InvalidConfigError(
            f"modules.json names a Pooling module, but {path} is missing")
    unserved = [k for k in ST_UNSERVED if cfg.get(k)]
    if unserved:
        raise UnsupportedFeatureError(
            f"{path}: {', '.join(unserved)}", "that pooling mode",
            "jaxinfer pools by last token, mean or CLS token")
    modes = [t for k, t in ST_MODES.items() if cfg.get(k)]
    if len(modes) != 1:
        raise InvalidConfigError(
            f"{path} must set exactly one of {', '.join(ST_MODES)}, got "
            f"{len(modes)}")
    return PoolerConfig(modes[0], normalize, matryoshka, source=path)


def _matryoshka(model_dir: str) -> tuple[int, ...] | None:
    """vLLM's reading of the HF config: ``matryoshka_dimensions`` lists the
    allowed cuts; ``is_matryoshka`` allows any."""
    cfg = _read_json(os.path.join(model_dir, "config.json")) or {}
    dims = cfg.get("matryoshka_dimensions")
    if dims:
        return tuple(int(d) for d in dims)
    return () if cfg.get("is_matryoshka") else None


def _read_json(path: str):
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidConfigError(f"{path} could not be read: {e}") from None
