"""`SamplingParams` with vLLM's field names, defaults and meanings."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

_GREEDY_EPS = 1e-5


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output holds all text so far
    DELTA = 1  # every output holds only what is new
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclasses.dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self._verify()

    def _verify(self):
        def bad(field, allowed):
            raise ValueError(f"{field} must be {allowed}, got "
                             f"{getattr(self, field)!r}")
        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "an integer >= 1")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", "in [-2, 2]")
        if not self.repetition_penalty > 0.0:
            bad("repetition_penalty", "> 0")
        if not self.temperature >= 0.0:
            bad("temperature", ">= 0")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or (self.top_k < -1):
            bad("top_k", "-1 or 0 (off) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "in [0, 1]")
        if self.max_tokens is not None and (
                not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad("max_tokens", "an integer >= 1 or None")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (
                not isinstance(self.logprobs, int) or self.logprobs < 0):
            bad("logprobs", "an integer >= 0 or None")
        if self.prompt_logprobs is not None and (
                not isinstance(self.prompt_logprobs, int)
                or self.prompt_logprobs < 0):
            bad("prompt_logprobs", "an integer >= 0 or None")
        if any(not s for s in self.stop):
            bad("stop", "a list of non-empty strings")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "an integer or None")
        if not isinstance(self.output_kind, RequestOutputKind):
            bad("output_kind", "a RequestOutputKind")

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        """``bad_words`` as token id lists (set by update_from_tokenizer)."""
        return getattr(self, "_bad_words_token_ids", None)

    def update_from_tokenizer(self, tokenizer) -> None:
        """Tokenizes ``bad_words`` as vLLM does: each word alone and, when
        that gives a different first token of the same length, with a
        leading space."""
        if not self.bad_words:
            self._bad_words_token_ids = []
            return
        words: list[list[int]] = []
        for word in self.bad_words:
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
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams":
        """Builds params from a dict that may hold None for "use default"; an
        unknown field is an error naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown sampling fields: {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(names))}")
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def clone(self) -> "SamplingParams":
        return dataclasses.replace(self)
