"""`speculative_config`: vLLM's keys, checked once at engine start.

vLLM takes a dict (``LLM(speculative_config={...})``) or JSON
(``--speculative-config``). Every key vLLM's ``SpeculativeConfig`` knows is
either served here or refused by name, and a key neither knows is refused
too, so nothing a user writes is dropped unseen.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..errors import InvalidConfigError, UnsupportedFeatureError

NAME = "speculative_config"
SERVED_METHODS = ("ngram", "draft_model", "eagle", "eagle3")
# Methods whose drafts the runner decodes on the device from a checkpoint
# given as ``model``: a draft model, or an EAGLE head (spec_decode/eagle.py).
MODEL_METHODS = ("draft_model", "eagle", "eagle3")
# vLLM's other methods: named so the refusal says "not yet", not "unknown".
LATER_METHODS = ("medusa", "mlp_speculator",
                 "deepseek_mtp", "ernie_mtp", "qwen3_next_mtp", "mimo_mtp",
                 "longcat_flash_mtp", "mtp")
# vLLM's prompt-lookup default when neither bound is given.
DEFAULT_LOOKUP = 5
SERVED_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max",
               "prompt_lookup_min", "model")
# vLLM keys for a draft model's own settings: none is served (the draft
# runs unquantized, on the target's device, with its context and dtype),
# so each is refused unless at its "off" value, which vLLM's own configs
# often spell out.
DRAFT_MODEL_KEYS = ("quantization", "max_model_len", "revision",
                    "code_revision", "enforce_eager", "speculative_token_tree",
                    "disable_padded_drafter_batch", "disable_log_stats",
                    "enable_chunked_prefill")
# 1 (or None) is the only draft tensor-parallel size: the draft runs whole
# on the target's one device.
DRAFT_TP_KEY = "draft_tensor_parallel_size"
# vLLM keys with no counterpart here whatever their value.
REFUSED_KEYS = ("disable_by_batch_size", "target_model_config",
                "target_parallel_config", "draft_model_config",
                "draft_parallel_config")


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # one of SERVED_METHODS
    num_speculative_tokens: int  # k: draft tokens verified per step and row
    prompt_lookup_min: int = DEFAULT_LOOKUP  # shortest suffix n-gram (ngram)
    prompt_lookup_max: int = DEFAULT_LOOKUP  # longest, tried first (ngram)
    # draft_model: the draft's folder, .gguf file or embedded name, loaded
    # with the target's load_format and dtype; eagle / eagle3: the head's
    # folder.
    model: str | None = None

    @property
    def uses_draft_model(self) -> bool:
        """The runner drafts on the device (a draft model or an EAGLE
        head); the scheduler hands it placeholders."""
        return self.method in MODEL_METHODS


def _int(key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidConfigError(
            f"{NAME}.{key} must be an integer >= {low}, got {value!r}")
    return value


def _method(cfg: dict) -> str:
    """vLLM's rule: ``method`` if given; else ``model`` "ngram" / "[ngram]"
    means n-gram, any other model a draft model."""
    method = cfg.get("method")
    model = cfg.get("model")
    if method is None:
        if model is None:
            raise InvalidConfigError(
                f"{NAME} needs 'method' (e.g. {{\"method\": \"ngram\", "
                "\"num_speculative_tokens\": 4}})")
        method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
    if method in LATER_METHODS:
        raise UnsupportedFeatureError(
            f"{NAME}.method={method!r}", f"the {method!r} speculative method "
            "yet", "use method 'ngram' (prompt lookup), 'draft_model', "
            "'eagle' or 'eagle3'")
    if method not in SERVED_METHODS:
        raise InvalidConfigError(
            f"{NAME}.method {method!r} is not a speculative method: use "
            f"one of {', '.join(SERVED_METHODS + LATER_METHODS)}")
    if method == "ngram" and model not in (None, "ngram", "[ngram]"):
        raise InvalidConfigError(
            f"{NAME}.model={model!r} with method 'ngram': n-gram proposes "
            "from the request's own tokens; drop 'model', or use method "
            "'draft_model' to draft with that model")
    if method in MODEL_METHODS and (not isinstance(model, str) or not model
                                    or model in ("ngram", "[ngram]")):
        raise InvalidConfigError(
            f"{NAME} with method {method!r} needs 'model': the draft's "
            "folder, .gguf file or embedded name (an EAGLE head's folder)")
    return method


def parse_speculative_config(value: str | dict | None
                             ) -> SpeculativeConfig | None:
    """``value`` (a dict or its JSON; None: off) -> SpeculativeConfig, or
    a typed error naming the key at fault."""
    if value is None:
        return None
    cfg: Any = value
    if isinstance(value, str):
        try:
            cfg = json.loads(value)
        except ValueError:
            raise InvalidConfigError(
                f"{NAME} must be a JSON object, got {value!r}") from None
    if not isinstance(cfg, dict):
        raise InvalidConfigError(f"{NAME} must be a JSON object, got {value!r}")
    for key in cfg:
        if key in REFUSED_KEYS or (key in DRAFT_MODEL_KEYS
                                   and cfg[key] not in (None, False)) or (
                key == DRAFT_TP_KEY and cfg[key] not in (None, 1)):
            raise UnsupportedFeatureError(
                f"{NAME}.{key}", "a draft model's own settings",
                f"drop {key!r}: a draft runs unquantized on the target's "
                "device, with its dtype and context length")
        if key not in SERVED_KEYS + DRAFT_MODEL_KEYS + (DRAFT_TP_KEY,):
            raise InvalidConfigError(
                f"{NAME} has no key {key!r}: it takes "
                f"{', '.join(SERVED_KEYS)}")
    method = _method(cfg)
    if "num_speculative_tokens" not in cfg:
        raise InvalidConfigError(
            f"{NAME} needs num_speculative_tokens (draft tokens per step)")
    k = _int("num_speculative_tokens", cfg["num_speculative_tokens"], 1)
    if method in MODEL_METHODS:
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if cfg.get(key) is not None:
                raise InvalidConfigError(
                    f"{NAME}.{key} is for method 'ngram'; method {method!r} "
                    "proposes by decoding")
        return SpeculativeConfig(method, k, model=cfg["model"])
    lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
    if lo is None and hi is None:
        lo = hi = DEFAULT_LOOKUP
    elif lo is None:
        lo = hi
    elif hi is None:
        hi = lo
    lo = _int("prompt_lookup_min", lo, 1)
    hi = _int("prompt_lookup_max", hi, 1)
    if hi < lo:
        raise InvalidConfigError(
            f"{NAME}.prompt_lookup_max ({hi}) must be >= prompt_lookup_min "
            f"({lo})")
    return SpeculativeConfig(method, k, lo, hi)
