"""`SamplingParams` with vLLM's field names, defaults and meanings.

Every invalid value raises a ValueError naming the field and its allowed
range, unknown keyword arguments included. Checks that need the model
(vocabulary size, ``max_logprobs``) are in ``verify_for_model``, which the
engine calls when a request arrives.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import numbers
from typing import Any

from .structured.params import GuidedDecodingParams, StructuredOutputsParams

_GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below it are greedy
# The sampler works in float32: a larger magnitude would become inf there.
_FLOAT32_MAX = 3.4028234663852886e38
# OpenAI's range for a logit bias; like vLLM, larger magnitudes are clamped
# (a bias of 1e308 would otherwise overflow the logits to inf).
LOGIT_BIAS_LIMIT = 100.0


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output holds all text so far
    DELTA = 1  # every output holds only what is new
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclasses.dataclass
class SamplingParams:
    n: int = 1  # independent samples of the prompt (one RequestOutput)
    best_of: int | None = None  # draw this many, return the n most likely
    presence_penalty: float = 0.0  # subtracted once per token in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides (>0) / multiplies (<0) logits of seen tokens
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # smallest set of tokens with this much mass; 1 = off
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0  # drop tokens below min_p x the top probability
    seed: int | None = None  # per-request stream; None = engine-derived
    stop: str | list[str] | None = None  # stop strings (not in the output)
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None  # never generated (as in vLLM)
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None = up to max_model_len
    min_tokens: int = 0  # EOS / stop ids are masked before this many tokens
    logprobs: int | None = None  # top-k logprobs per output token (+ sampled)
    prompt_logprobs: int | None = None  # top-k logprobs per prompt token
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Beam search through generate (vLLM's older spelling of
    # LLM.beam_search): beam width best_of or n, n beams returned.
    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam score = logprob / length ** this
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens
    # Output constrained to a JSON schema, regex, choice or grammar
    # (jaxinfer/structured/); vLLM's older guided_decoding is taken too.
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.output_kind, int) and not isinstance(
                self.output_kind, RequestOutputKind):
            try:
                self.output_kind = RequestOutputKind(self.output_kind)
            except ValueError:
                pass  # reported by _verify
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(
                self.structured_outputs)
        self._verify()
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in self.stop_token_ids or []]
        if self.top_k == -1:
            self.top_k = 0  # one spelling of "off"
        if self.logit_bias is not None:
            self.logit_bias = {
                int(k): min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(v)))
                for k, v in self.logit_bias.items()}
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = [int(t) for t in self.allowed_token_ids]
        if self.greedy:
            # As vLLM: greedy ignores the filters.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self._bad_words_token_ids: list[list[int]] | None = None
        # The compiled grammar (structured/grammar.py), set when the engine
        # checks the request; each sequence gets its own matcher from it.
        self._compiled_grammar = None

    def _verify(self):
        def bad(field, allowed):
            raise ValueError(f"{field} must be {allowed}, got "
                             f"{getattr(self, field)!r}")

        # The exact-type tests first: a bias or list over the whole
        # vocabulary is checked entry by entry, and the numbers ABCs'
        # isinstance is many times slower.
        def is_int(v):
            t = type(v)
            return t is int or (t is not bool
                                and isinstance(v, numbers.Integral))

        def is_num(v):
            t = type(v)
            return t is float or t is int or (
                t is not bool and isinstance(v, numbers.Real))

        def is_token_key(k):  # an int, or a string spelling one (JSON keys)
            if type(k) is int:
                return True
            if isinstance(k, str):
                try:
                    int(k)
                except ValueError:
                    return False
                return True
            return is_int(k)

        for field in ("presence_penalty", "frequency_penalty",
                      "repetition_penalty", "temperature", "top_p", "min_p"):
            if not is_num(getattr(self, field)):
                bad(field, "a number")
            if not abs(getattr(self, field)) <= _FLOAT32_MAX:  # NaN too
                bad(field, f"a finite number of magnitude <= {_FLOAT32_MAX:.4g} "
                    "(float32)")
        if not is_int(self.n) or self.n < 1:
            bad("n", "an integer >= 1")
        if self.best_of is not None and (
                not is_int(self.best_of) or self.best_of < self.n):
            bad("best_of", f"an integer >= n ({self.n}) or None")
        if not isinstance(self.use_beam_search, bool):
            bad("use_beam_search", "True or False")
        if not is_num(self.length_penalty):
            bad("length_penalty", "a number")
        if not self.use_beam_search and self.length_penalty != 1.0:
            bad("length_penalty", "1.0 unless use_beam_search is True (it "
                "weighs beam scores)")
        if self.truncate_prompt_tokens is not None and (
                not is_int(self.truncate_prompt_tokens)
                or self.truncate_prompt_tokens < 1):
            bad("truncate_prompt_tokens", "an integer >= 1 or None")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", "in [-2, 2]")
        if not self.repetition_penalty > 0.0:
            bad("repetition_penalty", "> 0 (1 = off)")
        if not self.temperature >= 0.0:
            bad("temperature", ">= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "0 or -1 (off) or an integer >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "in [0, 1]")
        if self.seed is not None and not is_int(self.seed):
            bad("seed", "an integer or None")
        if self.max_tokens is not None and (
                not is_int(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", "an integer >= 1 or None")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        for field in ("logprobs", "prompt_logprobs"):
            value = getattr(self, field)
            if value is not None and (not is_int(value) or value < -1):
                bad(field, "an integer >= 0, -1 (the whole vocabulary) or None")
        if self.stop is not None and (
                not isinstance(self.stop, (list, tuple))
                or any(not isinstance(s, str) or not s for s in self.stop)):
            bad("stop", "a string or a list of non-empty strings")
        if self.stop and not self.detokenize:
            bad("detokenize", "True when stop strings are given")
        if self.stop_token_ids is not None and any(
                not is_int(t) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids >= 0")
        if self.bad_words is not None and (
                not isinstance(self.bad_words, (list, tuple))
                or any(not isinstance(w, str) or not w.strip()
                       for w in self.bad_words)):
            bad("bad_words", "a list of non-empty strings")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                bad("logit_bias", "a dict token id -> bias")
            for k, v in self.logit_bias.items():
                if not is_token_key(k):
                    bad("logit_bias", "a dict whose keys are token ids")
                if not is_num(v) or v != v:
                    bad("logit_bias", "a dict whose values are numbers")
        if self.allowed_token_ids is not None and (
                not isinstance(self.allowed_token_ids, (list, tuple))
                or not self.allowed_token_ids
                or any(not is_int(t) or t < 0 for t in self.allowed_token_ids)):
            bad("allowed_token_ids", "a non-empty list of token ids or None")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                bad("structured_outputs", "a StructuredOutputsParams, a dict "
                    "of its fields, or None")
            if self.use_beam_search:
                bad("structured_outputs", "None with use_beam_search (beam "
                    "search does not take constraints)")
        if not isinstance(self.output_kind, RequestOutputKind):
            bad("output_kind", "a RequestOutputKind (CUMULATIVE, DELTA, "
                "FINAL_ONLY)")
        if self.greedy and self.num_samples > 1 and not self.use_beam_search:
            bad("n" if self.n > 1 else "best_of",
                "1 when using greedy sampling (temperature 0); use beam "
                "search or temperature > 0 for several samples")

    def verify_for_model(self, vocab_size: int, max_logprobs: int) -> None:
        """Checks against the served model (as vLLM's input processor)."""
        def bad(field, allowed, value):
            raise ValueError(f"{field} must be {allowed}, got {value!r}")

        for field in ("logprobs", "prompt_logprobs"):
            value = getattr(self, field)
            if value == -1:  # vLLM: the whole vocabulary
                value = vocab_size
                setattr(self, field, value)
            if value is not None and value > max_logprobs:
                bad(field, f"<= max_logprobs ({max_logprobs}; -1 asks for "
                    f"the whole vocabulary, {vocab_size})", value)
        if self.top_k > vocab_size:
            bad("top_k", f"<= the vocabulary size ({vocab_size})", self.top_k)
        for field, ids in (("stop_token_ids", self.stop_token_ids),
                           ("allowed_token_ids", self.allowed_token_ids),
                           ("logit_bias", list(self.logit_bias or ()))):
            out = [t for t in ids or () if not 0 <= t < vocab_size]
            if out:
                bad(field, f"token ids in [0, {vocab_size})", out[:5])

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        """``bad_words`` as token id lists (set by update_from_tokenizer)."""
        return self._bad_words_token_ids

    def update_from_tokenizer(self, tokenizer) -> None:
        """Tokenizes ``bad_words`` as vLLM does: each word alone and, when
        that gives a different first token of the same length, with a
        leading space."""
        words: list[list[int]] = []
        for word in self.bad_words or ():
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if plain:
                words.append(plain)
            spaced = tokenizer.encode(" " + word.lstrip(),
                                      add_special_tokens=False)
            if spaced and (not plain or (spaced[0] != plain[0]
                                         and len(spaced) == len(plain))):
                words.append(spaced)
        self._bad_words_token_ids = words

    @property
    def compiled_grammar(self):
        """The request's compiled grammar (set by `set_compiled_grammar`)."""
        return self._compiled_grammar

    def set_compiled_grammar(self, compiled) -> None:
        self._compiled_grammar = compiled

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def num_samples(self) -> int:
        """Sequences drawn: best_of when set, else n."""
        return self.best_of or self.n

    @classmethod
    def from_optional(cls, **kwargs: Any) -> SamplingParams:
        """Builds params from a dict that may hold None for "use default"; an
        unknown field is an error naming it."""
        kwargs = _vllm_fields_handled(dict(kwargs))
        _check_known(kwargs)
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def clone(self) -> SamplingParams:
        new = dataclasses.replace(self)
        new._bad_words_token_ids = self._bad_words_token_ids
        new._compiled_grammar = self._compiled_grammar
        return new


@dataclasses.dataclass
class BeamSearchParams:
    """Parameters of `LLM.beam_search` (vLLM's names and defaults)."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        def bad(field, allowed):
            raise ValueError(f"{field} must be {allowed}, got "
                             f"{getattr(self, field)!r}")
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            bad("beam_width", "an integer >= 1")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", "an integer >= 1")
        if not self.temperature >= 0.0:
            bad("temperature", ">= 0")


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(SamplingParams))
# vLLM keyword arguments taken under another field's name.
SAMPLING_ALIASES = {"guided_decoding": "structured_outputs"}


def _check_known(kwargs) -> None:
    unknown = sorted(set(kwargs) - _FIELD_NAMES)
    if unknown:
        raise ValueError(f"unknown sampling fields: {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(_FIELD_NAMES))}")


def _vllm_fields_handled(kwargs: dict) -> dict:
    """vLLM fields jaxinfer lacks: refused (UnsupportedFeatureError, a
    ValueError naming the feature) or ignored with a logged reason."""
    from .compat.request_fields import SAMPLING_FIELDS
    guided = kwargs.pop("guided_decoding", None)
    if guided is not None:
        if kwargs.get("structured_outputs") is not None:
            raise ValueError("give structured_outputs or guided_decoding, "
                             "not both")
        if isinstance(guided, dict):
            guided = GuidedDecodingParams(**guided)
        if not isinstance(guided, GuidedDecodingParams):
            raise ValueError("guided_decoding must be a GuidedDecodingParams "
                             f"or None, got {type(guided).__name__}")
        kwargs["structured_outputs"] = guided.structured()
    for name in [k for k in kwargs if k in SAMPLING_FIELDS]:
        SAMPLING_FIELDS[name].check(name, kwargs.pop(name))
    return kwargs


def _rejecting_unknown(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        kwargs = _vllm_fields_handled(dict(kwargs))
        _check_known(kwargs)
        if len(args) > len(_FIELD_NAMES):
            raise ValueError(f"SamplingParams takes at most {len(_FIELD_NAMES)} "
                             f"positional arguments, got {len(args)}")
        init(self, *args, **kwargs)
    return __init__


# A misspelled field is a ValueError naming it (not the dataclass TypeError).
# Wrapping the generated __init__ is deliberate; mypy refuses method assignment.
SamplingParams.__init__ = _rejecting_unknown(  # type: ignore[method-assign]
    SamplingParams.__init__)
