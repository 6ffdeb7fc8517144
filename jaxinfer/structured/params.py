"""vLLM's structured-output request types: `StructuredOutputsParams` and
the older `GuidedDecodingParams` (same constraint fields, plus a backend).

Exactly one constraint is given: ``json`` (a JSON schema, as a dict or its
JSON text), ``regex``, ``choice`` (a list of strings), ``grammar`` (Lark or
GBNF/EBNF text), ``json_object`` (any JSON object) or ``structural_tag``.
Invalid values raise ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..errors import UnsupportedFeatureError

# The backends a request may name; "guidance" is vLLM's name for llguidance.
BACKENDS = ("auto", "guidance", "llguidance")
KINDS = ("json", "regex", "choice", "grammar", "json_object",
         "structural_tag")


@dataclasses.dataclass
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark, or GBNF / EBNF
    json_object: bool | None = None  # any JSON object
    disable_fallback: bool = False  # one backend only: nothing to fall back to
    disable_any_whitespace: bool = False  # compact JSON, no free whitespace
    disable_additional_properties: bool = False  # objects take listed keys only
    whitespace_pattern: str | None = None  # a regex for JSON's whitespace
    structural_tag: str | None = None  # refused (see kind())

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                "structured outputs take exactly one of json, regex, choice, "
                f"grammar, json_object, structural_tag; got "
                f"{', '.join(given) or 'none'}")
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except ValueError as e:
                raise ValueError(f"structured outputs json must be a JSON "
                                 f"schema; its text does not parse: {e}") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError("structured outputs json must be a JSON schema "
                             f"(an object), got {type(self.json).__name__}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError("structured outputs regex must be a string")
        if self.choice is not None and (
                not isinstance(self.choice, (list, tuple)) or not self.choice
                or any(not isinstance(c, str) for c in self.choice)):
            raise ValueError("structured outputs choice must be a non-empty "
                             "list of strings")
        if self.choice is not None:
            self.choice = list(self.choice)
        if self.grammar is not None and (not isinstance(self.grammar, str)
                                         or not self.grammar.strip()):
            raise ValueError("structured outputs grammar must be a non-empty "
                             "string (Lark or GBNF)")
        if self.json_object not in (None, True, False):
            raise ValueError("structured outputs json_object must be True")
        if self.whitespace_pattern is not None and not isinstance(
                self.whitespace_pattern, str):
            raise ValueError("structured outputs whitespace_pattern must be "
                             "a regex string")

    @property
    def kind(self) -> str:
        """Which constraint this is (one of KINDS)."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def cache_key(self) -> str:
        """A string that identifies the compiled grammar."""
        fields = dataclasses.asdict(self)
        fields.pop("disable_fallback")
        return json.dumps(fields, sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, value: Any) -> StructuredOutputsParams:
        """From a request body's ``structured_outputs`` object; unknown keys
        are errors naming them."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError("structured_outputs must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown structured_outputs fields: "
                             f"{', '.join(unknown)}; known: "
                             f"{', '.join(sorted(known))}")
        return cls(**value)


@dataclasses.dataclass
class GuidedDecodingParams:
    """vLLM's older spelling (``SamplingParams(guided_decoding=...)``)."""
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    backend: str | None = None
    backend_was_auto: bool = False
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        check_backend("guided_decoding.backend", self.backend)
        self.structured()  # the same checks

    def structured(self) -> StructuredOutputsParams:
        fields = dataclasses.asdict(self)
        fields.pop("backend")
        fields.pop("backend_was_auto")
        return StructuredOutputsParams(**fields)


# vLLM's other backends: a feature jaxinfer lacks, not a misspelling.
OTHER_VLLM_BACKENDS = ("xgrammar", "outlines", "lm-format-enforcer")


def check_backend(field: str, backend: str | None) -> None:
    """Backends other than llguidance are refused, naming the one served."""
    if backend is None:
        return
    name = backend.split(":")[0]
    if name in OTHER_VLLM_BACKENDS:
        raise UnsupportedFeatureError(
            field, f"the {name} structured output backend",
            f"structured outputs use llguidance here; give one of "
            f"{', '.join(BACKENDS)} or leave it out")
    if name not in BACKENDS:
        raise ValueError(
            f"{field}={backend!r}: this server's structured outputs use "
            f"llguidance; give one of {', '.join(BACKENDS)} or leave it out")
