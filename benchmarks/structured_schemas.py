"""The schemas the structured-output benchmarks and the backend comparison
use: a 20-field nested JSON schema (the mask-cost target's), one instance
of it, and a list of JSON Schema / regex / grammar features for coverage."""

from __future__ import annotations

import json

_ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 30},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"type": "string", "enum": ["US", "FR", "DE", "JP"]},
    },
    "required": ["street", "city", "zip", "country"],
    "additionalProperties": False,
}

# 20 leaf fields over three levels of objects and an array of objects.
NESTED_20 = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "maxItems": 5},
        "address": _ADDRESS,
        "company": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "role": {"type": "string",
                         "enum": ["engineer", "manager", "analyst"]},
                "since": {"type": "integer", "minimum": 1800,
                          "maximum": 2100},
                "office": _ADDRESS,
            },
            "required": ["name", "role", "since", "office"],
            "additionalProperties": False,
        },
        "projects": {
            "type": "array", "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string", "maxLength": 30},
                               "done": {"type": "boolean"}},
                "required": ["title", "done"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["id", "name", "email", "age", "active", "score", "tags",
                 "address", "company", "projects"],
    "additionalProperties": False,
}

NESTED_20_INSTANCE = {
    "id": 4127, "name": "Ada Lovelace", "email": "ada@example.com",
    "age": 36, "active": True, "score": 97.5, "tags": ["math", "engines"],
    "address": {"street": "12 St James's Square", "city": "London",
                "zip": "10001", "country": "US"},
    "company": {"name": "Analytical Engines", "role": "engineer",
                "since": 1842, "office": {"street": "1 Main St",
                                          "city": "Paris", "zip": "75001",
                                          "country": "FR"}},
    "projects": [{"title": "Bernoulli numbers", "done": True},
                 {"title": "Note G", "done": False}],
}


def instance_text() -> str:
    """The instance as compact JSON (what a whitespace-strict grammar
    produces)."""
    return json.dumps(NESTED_20_INSTANCE, separators=(",", ":"))


# Features a served schema may use, one small schema each (coverage).
JSON_FEATURES = {
    "types": {"type": "object", "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"},
        "n": {"type": "number"}, "b": {"type": "boolean"},
        "z": {"type": "null"}}},
    "enum_const": {"type": "object", "properties": {
        "e": {"enum": ["a", 1, None]}, "c": {"const": "x"}}},
    "nullable_list": {"type": ["string", "null"]},
    "string_length": {"type": "string", "minLength": 2, "maxLength": 5},
    "pattern": {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"},
    "format_datetime": {"type": "string", "format": "date-time"},
    "format_email": {"type": "string", "format": "email"},
    "format_uuid": {"type": "string", "format": "uuid"},
    "int_bounds": {"type": "integer", "minimum": -5, "maximum": 300},
    "exclusive_bounds": {"type": "integer", "exclusiveMinimum": 0,
                         "exclusiveMaximum": 10},
    "number_bounds": {"type": "number", "minimum": 0.5, "maximum": 2.5},
    "multiple_of": {"type": "integer", "multipleOf": 5},
    "array_bounds": {"type": "array", "items": {"type": "integer"},
                     "minItems": 1, "maxItems": 3},
    "unique_items": {"type": "array", "items": {"type": "integer"},
                     "uniqueItems": True},
    "prefix_items": {"type": "array", "prefixItems": [{"type": "string"},
                                                      {"type": "integer"}]},
    "anyof": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "oneof": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "allof": {"allOf": [{"type": "object", "properties": {
        "a": {"type": "string"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}}}]},
    "ref_defs": {"$defs": {"p": {"type": "object", "properties": {
        "x": {"type": "integer"}}, "required": ["x"]}},
        "type": "object", "properties": {"p": {"$ref": "#/$defs/p"}}},
    "recursive_ref": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"anyOf": [
            {"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["v", "next"]}}, "$ref": "#/$defs/node"},
    "additional_schema": {"type": "object",
                          "additionalProperties": {"type": "integer"}},
    "pattern_properties": {"type": "object", "patternProperties": {
        "^x_": {"type": "integer"}}},
    "min_max_properties": {"type": "object", "minProperties": 1,
                           "maxProperties": 2},
    "property_names": {"type": "object",
                       "propertyNames": {"pattern": "^[a-z]+$"}},
    "dependent_required": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}},
        "dependentRequired": {"a": ["b"]}},
    "if_then_else": {"type": "object", "if": {"properties": {
        "a": {"const": 1}}}, "then": {"required": ["b"]}},
    "not": {"not": {"type": "string"}},
    "nested_20": NESTED_20,
}

REGEX_FEATURES = {
    "classes": r"[A-Z][a-z]{2,8} [0-9]+",
    "alternation": r"(cat|dog|bird)s?",
    "anchors": r"^\d{3}-\d{4}$",
    "unicode": r"\p{L}+",
    "lookahead": r"(?=a)ab",
    "backreference": r"(a)\1",
}

GRAMMARS = {
    "gbnf_arith": ('root ::= expr\nexpr ::= term ("+" term)*\n'
                   'term ::= [0-9]+'),
    "lark_arith": 'start: expr\nexpr: term ("+" term)*\nterm: /[0-9]+/',
}
