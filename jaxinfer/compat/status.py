"""What jaxinfer does with a name of vLLM's surface that it does not
implement: ignore it (only where that is harmless, with the reason) or
refuse it with a typed error naming the missing feature.

Supported names carry no entry: that they are supported is read from the
code itself (a field of ``EngineArgs`` / ``SamplingParams``, a flag of the
serve parser, a field of the request models), see ``surface.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..errors import UnsupportedFeatureError

logger = logging.getLogger("jaxinfer.compat")


@dataclasses.dataclass(frozen=True)
class Ignored:
    """Accepted, no effect; ``reason`` says why that changes nothing."""
    reason: str

    def check(self, name: str, value: Any, level: int = logging.WARNING) -> None:
        logger.log(level, "%s=%r accepted and ignored: %s", name, value,
                   self.reason)


@dataclasses.dataclass(frozen=True)
class Refused:
    """Refused unless the value is one of ``accepts`` (vLLM's value that
    means "off", or the only behaviour jaxinfer has)."""
    feature: str  # what is missing, e.g. "LoRA adapters"
    hint: str = ""  # what to do instead
    accepts: tuple = (None, False)

    def allows(self, value: Any) -> bool:
        return any(_same(value, a) for a in self.accepts)

    def check(self, name: str, value: Any, level: int = logging.WARNING) -> None:
        if not self.allows(value):
            raise UnsupportedFeatureError(name, self.feature, self.hint)


# A table entry: what is done with a name jaxinfer does not implement.
Status = Ignored | Refused


def _same(value: Any, accepted: Any) -> bool:
    """Compares a parsed CLI string or a Python value with an accepted
    value: ``"1"`` is 1, ``"false"`` is False, ``"{}"`` is an empty dict."""
    if accepted is None or isinstance(accepted, bool):
        if isinstance(value, str):
            value = {"": None, "none": None, "false": False,
                     "true": True}.get(value.strip().lower(), value)
        return value is accepted or (accepted is False and value in ({}, [], ""))
    if isinstance(accepted, (int, float)):
        try:
            return float(value) == float(accepted)
        except (TypeError, ValueError):
            return False
    return str(value).strip().lower() == str(accepted).lower()


def refuse(feature: str, hint: str = "", accepts: tuple = (None, False)) -> Refused:
    return Refused(feature, hint, accepts)


def ignore(reason: str) -> Ignored:
    return Ignored(reason)
