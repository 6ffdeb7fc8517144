"""One request's logprobs as they arrive step by step (host side)."""

from __future__ import annotations

from ..logprobs import Logprob, LogprobRows, PromptLogprobs, SampleLogprobs, decode_entry
from ..sampling_params import SamplingParams


class LogprobsState:
    def __init__(self, params: SamplingParams, decode=None):
        self.k = params.logprobs
        self.prompt_k = params.prompt_logprobs
        self.decode = decode  # token id -> text, or None (detokenize=False)
        self.logprobs: SampleLogprobs | None = [] if self.k is not None else None
        self.cumulative: float | None = 0.0 if self.k is not None else None
        # Entry 0 is None: nothing scores the first prompt token.
        self.prompt: PromptLogprobs | None = (
            [None] if self.prompt_k is not None else None)
        self._prompt_sent = 0

    def add_sample(self, rows: LogprobRows) -> None:
        if self.k is None:
            return
        self.add_entry(rows.to_dict(0, self.k), int(rows.token_ids[0, 0]))

    def add_entry(self, entry: dict[int, Logprob], token_id: int) -> None:
        """One sampled token's logprobs (the chosen ``token_id`` and the top
        k), decoded here when the request shows text: the engine's rows and
        a front end's copy of an engine core's entries both arrive here."""
        if self.logprobs is None:
            return
        if self.cumulative is None:
            raise RuntimeError("sample logprobs kept without a sum")
        if self.decode is not None:
            decode_entry(entry, self.decode)
        self.logprobs.append(entry)
        self.cumulative += float(entry[token_id].logprob)

    def add_prompt(self, first: int, rows: LogprobRows) -> None:
        """Rows scoring prompt tokens first, first + 1, ...; positions already
        held (a chunk recomputed after preemption) are skipped."""
        if self.prompt is None:
            return
        if self.prompt_k is None:
            raise RuntimeError("prompt logprobs kept without a count")
        for r in range(len(rows)):
            if first + r == len(self.prompt):
                self.prompt.append(rows.to_dict(r, self.prompt_k, self.decode))

    def sample_output(self, start: int) -> tuple[SampleLogprobs | None,
                                                 float | None]:
        """Logprobs from output token ``start`` on, and the running sum."""
        if self.logprobs is None:
            return None, None
        return self.logprobs[start:], self.cumulative

    def prompt_output(self, delta: bool) -> PromptLogprobs | None:
        """All prompt logprobs so far; in delta mode only the unsent ones
        (vLLM sends them with the first output)."""
        if self.prompt is None:
            return None
        if not delta:
            return self.prompt
        out = self.prompt[self._prompt_sent:]
        self._prompt_sent = len(self.prompt)
        return out
