"""Reads a tool call's JSON object while it is still being generated: the
fields seen so far, each with its raw text and whether it is complete, so
that a stream can send a function's name as soon as its string closes and
its arguments as their text arrives. Nothing here guesses at missing text;
a complete object is checked with ``json.loads`` by the caller."""

from __future__ import annotations

import dataclasses
import json

WHITESPACE = " \t\n\r"


class JSONScanError(ValueError):
    """The text cannot be the start of a JSON object of the expected shape."""


@dataclasses.dataclass
class ScannedField:
    raw: str  # the value's text as generated so far
    complete: bool  # the value has ended


@dataclasses.dataclass
class ScannedObject:
    fields: dict[str, ScannedField]
    end: int | None  # index just past the closing brace; None while open


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in WHITESPACE:
        i += 1
    return i


def string_end(s: str, i: int) -> int | None:
    """``s[i]`` is a quote: the index past the closing quote, or None."""
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def value_end(s: str, i: int) -> int | None:
    """The index past the JSON value starting at ``s[i]``, or None if the
    text ends first. Brackets are counted, strings skipped."""
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in "{[":
        depth = 0
        while i < len(s):
            c = s[i]
            if c == '"':
                end = string_end(s, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i  # a number or a literal: ends at a delimiter
    while j < len(s) and s[j] not in ",}]" + WHITESPACE:
        j += 1
    return None if j == len(s) else j


def scan_object(s: str, i: int) -> ScannedObject:
    """``s[i]`` is ``{``: the object's fields so far. Raises JSONScanError
    when the text cannot continue into an object."""
    fields: dict[str, ScannedField] = {}
    i += 1
    expect_key = True
    while True:
        i = skip_ws(s, i)
        if i == len(s):
            return ScannedObject(fields, None)
        c = s[i]
        if c == "}":
            return ScannedObject(fields, i + 1)
        if c == "," and not expect_key:
            expect_key = True
            i += 1
            continue
        if c != '"' or not expect_key:
            raise JSONScanError(f"unexpected {c!r} in a tool call object")
        end = string_end(s, i)
        if end is None:
            return ScannedObject(fields, None)
        key = json.loads(s[i:end])
        i = skip_ws(s, end)
        if i == len(s):
            return ScannedObject(fields, None)
        if s[i] != ":":
            raise JSONScanError(f"expected ':' after the key {key!r}")
        i = skip_ws(s, i + 1)
        if i == len(s):
            fields[key] = ScannedField("", False)
            return ScannedObject(fields, None)
        end = value_end(s, i)
        if end is None:
            fields[key] = ScannedField(s[i:], False)
            return ScannedObject(fields, None)
        fields[key] = ScannedField(s[i:end], True)
        i, expect_key = end, False
