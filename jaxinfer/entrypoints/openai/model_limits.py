"""Bounds that depend on the served model, stated in the OpenAPI schema.

Request models mark such a field with ``limit(name)``; the app's schema
replaces the static bound with the engine's value, so the documented range
is the range the server accepts (a token id is documented below the
vocabulary size, not below 2**31).
"""

from __future__ import annotations

from typing import Any

_MARK = "x-limit"


def limit(name: str) -> dict[str, str]:
    """``json_schema_extra`` marking a field bounded by the model limit ``name``."""
    return {_MARK: name}


def model_limits(engine) -> dict[str, int]:
    """The per-model maxima a served request must respect."""
    vocab = engine.model.vocab_size
    return {"token_id": vocab - 1, "vocab_size": vocab,
            "max_tokens": engine.max_model_len - 1,
            "max_model_len": engine.max_model_len,
            "max_num_seqs": engine.model.max_num_seqs,
            "max_logprobs": engine.model.args.max_logprobs}


def apply_limits(schema: Any, limits: dict[str, int]) -> Any:
    """Sets ``maximum`` of every marked (sub)schema in place; returns it."""
    if isinstance(schema, dict):
        name = schema.pop(_MARK, None)
        if name is not None:
            targets = [schema] + [s for s in schema.get("anyOf", ())
                                  if isinstance(s, dict) and "maximum" in s]
            for target in targets:
                if "maximum" in target or target is schema and "type" in schema:
                    target["maximum"] = limits[name]
        for value in schema.values():
            apply_limits(value, limits)
    elif isinstance(schema, list):
        for value in schema:
            apply_limits(value, limits)
    return schema
