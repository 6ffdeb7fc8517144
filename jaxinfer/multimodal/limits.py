"""``limit_mm_per_prompt``: vLLM's per-modality item counts, given as a dict
(``LLM(limit_mm_per_prompt={"image": 2})``) or as JSON on the command line
(``--limit-mm-per-prompt '{"image": 2}'``)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidConfigError, UnsupportedFeatureError

# vLLM's default count for a modality the limits do not name.
DEFAULT_LIMIT = 999
MODALITIES = ("image",)
OTHER_MODALITIES = ("video", "audio")


def parse_limit_mm_per_prompt(value: Any) -> dict[str, int]:
    """The limits as {modality: count}; an empty dict for None."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InvalidConfigError(
                f"limit_mm_per_prompt must be JSON such as '{{\"image\": 2}}', "
                f"got {value!r} ({e})") from None
    if not isinstance(value, dict):
        raise InvalidConfigError(
            f"limit_mm_per_prompt must map modalities to counts, such as "
            f"{{'image': 2}}, got {value!r}")
    out = {}
    for modality, count in value.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidConfigError(
                f"limit_mm_per_prompt[{modality!r}] must be a count >= 0, "
                f"got {count!r}")
        if modality in OTHER_MODALITIES:
            if count:
                raise UnsupportedFeatureError(
                    "limit_mm_per_prompt (--limit-mm-per-prompt)",
                    f"multimodal inputs of kind "
                    f"{modality!r} (only images are served)",
                    f"drop {modality!r} or set it to 0")
            continue
        if modality not in MODALITIES:
            raise InvalidConfigError(
                f"limit_mm_per_prompt names an unknown modality {modality!r}; "
                f"known: {', '.join(MODALITIES + OTHER_MODALITIES)}")
        out[modality] = count
    return out


def limit_for(limits: dict[str, int], modality: str) -> int:
    return limits.get(modality, DEFAULT_LIMIT)
