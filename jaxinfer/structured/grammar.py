"""Grammar compilation and per-request matchers, through llguidance.

`GrammarCompiler` turns a `StructuredOutputsParams` into a compiled matcher
for one tokenizer and keeps it (an LRU per spec): a request gets a copy in
the start state (`CompiledGrammar.matcher`), so a schema is compiled once
however many requests use it. Schemas, regexes and grammars the library
refuses raise `InvalidStructuredOutputError` with its message.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError
from .params import StructuredOutputsParams

if TYPE_CHECKING:  # imported where used: a server without grammars never loads it
    import llguidance

logger = logging.getLogger(__name__)

# Compiled grammars kept per compiler (one tokenizer): enough for the
# schemas of a busy server's clients; an evicted one is compiled again.
CACHE_SIZE = 256


class InvalidStructuredOutputError(InvalidRequestError):
    """A schema, regex, choice list or grammar that cannot constrain output
    (the library refused it, or it can match nothing)."""


class Matcher:
    """One request's position in its grammar; advanced on the host by each
    token the request samples."""

    def __init__(self, ll_matcher, vocab_size: int):
        self._m = ll_matcher
        self.vocab_size = vocab_size  # the model's: the mask's width in bits

    def accept(self, token_id: int) -> bool:
        """Advances by one sampled token; False when the grammar refuses it
        (the matcher then stays in its error state)."""
        return self._m.consume_token(token_id)

    @property
    def finished(self) -> bool:
        """The grammar has produced its whole output (only EOS can follow),
        or the matcher is in its error state."""
        return self._m.is_stopped()

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None

    @property
    def ll_matcher(self):
        return self._m


class CompiledGrammar:
    """A grammar compiled for one tokenizer, in its start state."""

    def __init__(self, ll_matcher, key: str, vocab_size: int):
        self._start = ll_matcher
        self.key = key
        self.vocab_size = vocab_size

    def matcher(self) -> Matcher:
        return Matcher(self._start.deep_copy(), self.vocab_size)


def _lark_literal(text: str) -> str:
    return json.dumps(text)  # Lark string literals take JSON's escapes


def grammar_spec(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for a request's constraint (vLLM's guidance
    backend's reading of each field)."""
    import llguidance
    M = llguidance.LLMatcher
    kind = params.kind
    schema: Any
    if kind in ("json", "json_object"):
        schema = params.json if kind == "json" else {"type": "object"}
        if schema is True:
            schema = {}
        if schema is False:
            raise InvalidStructuredOutputError(
                "structured outputs json is the schema false, which no output "
                "matches")
        if params.disable_additional_properties:
            schema = _no_additional_properties(schema)
        options: Any = {"whitespace_flexible": not params.disable_any_whitespace}
        if params.whitespace_pattern is not None:
            options["whitespace_pattern"] = params.whitespace_pattern
        try:
            return M.grammar_from_json_schema(schema, defaults=options)
        except ValueError as e:
            raise InvalidStructuredOutputError(
                f"structured outputs json is not a usable JSON schema: {e}") from None
    if kind == "regex":
        return M.grammar_from_regex(str(params.regex))
    if kind == "choice":
        return M.grammar_from_lark(
            "start: " + " | ".join(_lark_literal(c) for c in params.choice or ()))
    if kind == "grammar":
        try:
            return llguidance.grammar_from("grammar", str(params.grammar))
        except ValueError as e:
            raise InvalidStructuredOutputError(
                f"structured outputs grammar does not parse as Lark or GBNF: "
                f"{e}") from None
    raise InvalidStructuredOutputError(
        "structured outputs structural_tag is not served; use json, regex, "
        "choice, grammar or json_object")


def _no_additional_properties(schema):
    """The schema with ``additionalProperties: false`` on every object that
    does not set it (vLLM's disable_additional_properties)."""
    if isinstance(schema, list):
        return [_no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and \
            "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


class GrammarCompiler:
    """Compiles structured-output params for one tokenizer, with a cache of
    compiled grammars keyed by the params' spec. Thread-safe (the servers
    check requests on worker threads)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        self._hf = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._cache: collections.OrderedDict[str, CompiledGrammar] = (
            collections.OrderedDict())
        self._lock = threading.Lock()
        self.compiles = 0  # grammars compiled (cache misses)

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use."""
        if self._ll_tokenizer is None:
            import llguidance
            text = self._hf.backend_tokenizer.to_str()
            self._ll_tokenizer = llguidance.LLTokenizer(
                text, n_vocab=self.vocab_size,
                eos_token=self.eos_token_ids or None)
        return self._ll_tokenizer

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        key = params.cache_key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = CompiledGrammar(self._compile(params), key,
                                   self.vocab_size)
        with self._lock:
            self._cache[key] = compiled
            self.compiles += 1
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, params: StructuredOutputsParams):
        import llguidance
        M = llguidance.LLMatcher
        spec = grammar_spec(params)
        tok = self.ll_tokenizer
        error = M.validate_grammar(spec, tok)
        if error:
            raise InvalidStructuredOutputError(
                f"structured outputs {params.kind} was refused by the grammar "
                f"library: {error.strip()}")
        matcher = M(tok, spec, log_level=0)
        if matcher.is_error():
            raise InvalidStructuredOutputError(
                f"structured outputs {params.kind} was refused by the grammar "
                f"library: {matcher.get_error().strip()}")
        if _matches_nothing(matcher, self.vocab_size):
            raise InvalidStructuredOutputError(
                f"structured outputs {params.kind} matches no text: no token "
                "can start an output")
        return matcher


def _matches_nothing(matcher, vocab_size: int) -> bool:
    """Whether the start state allows no token at all (e.g. a regex that
    cannot match, a choice of only empty strings)."""
    import numpy as np
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
    mask = allocate_token_bitmask(1, vocab_size)
    probe = matcher.deep_copy()
    fill_next_token_bitmask(probe, mask, 0)
    return probe.is_error() or not np.any(mask)
