"""Incremental detokenization and stop strings for one completion.

Built on `tokenizers`' DecodeStream, which buffers tokens until they form
whole UTF-8 characters and, primed with the prompt's last tokens, gets
SentencePiece / byte-level spacing right.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from ..sampling_params import SamplingParams

# Prompt tokens that prime the stream so the first output token is spaced as
# it would be in context.
_PRIME_TOKENS = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int],
                 params: SamplingParams):
        self.params = params
        self._backend = getattr(tokenizer, "backend_tokenizer", None) or \
            tokenizer._tokenizer
        self._stream = DecodeStream(
            ids=list(prompt_token_ids[-_PRIME_TOKENS:]),
            skip_special_tokens=params.skip_special_tokens)
        self.text = ""
        if not isinstance(params.stop, list):  # SamplingParams.__post_init__
            raise TypeError("SamplingParams.stop is not a list: "
                            f"{type(params.stop).__name__}")
        self._stops: list[str] = params.stop
        # Longest stop string minus one: text that may still become a stop
        # match and is therefore held back from streaming.
        self._holdback = max((len(s) for s in self._stops), default=1) - 1
        self.stop_reason: str | None = None
        self._num_tokens = 0  # stop strings count only after min_tokens (vLLM)
        # spaces_between_special_tokens=False (vLLM's fast detokenizer): a
        # special token right after another is its bare content, without
        # the space a decoder may put before it.
        self._added: dict[int, str] | None = None
        self._last_added = False
        if not (params.skip_special_tokens
                or params.spaces_between_special_tokens):
            self._added = {i: t.content for i, t in
                           self._backend.get_added_tokens_decoder().items()}

    def step(self, token_id: int) -> bool:
        """Adds one token; returns True when a stop string ended the text."""
        piece = self._stream.step(self._backend, token_id)
        if self._added is not None:
            content = self._added.get(token_id)
            if content is not None and self._last_added:
                piece = content
            self._last_added = content is not None
        self._num_tokens += 1
        if not piece:
            return False
        if self._num_tokens <= self.params.min_tokens:
            self.text += piece
            return False
        start = max(0, len(self.text) - self._holdback)
        self.text += piece
        for stop in self._stops:
            idx = self.text.find(stop, start)
            if idx != -1:
                end = idx + len(stop) if self.params.include_stop_str_in_output else idx
                self.text = self.text[:end]
                self.stop_reason = stop
                return True
        return False

    def visible_text(self, finished: bool) -> str:
        """Text safe to show now: while unfinished, a tail that could still
        turn into a stop string is held back."""
        if finished or not self.params.stop or self._holdback == 0:
            return self.text
        return self.text[:max(0, len(self.text) - self._holdback)]
