"""Turns updated requests into vLLM `RequestOutput`s (text, stops, kinds).

The one place for a request's text: the engine runs it over its
`Request`s (`LLM`, the single-process server), and the front end of a
multi-process server over its copies of the engine core's samples
(`frontend_text.py`), so both trim text, hold back stop-string prefixes
and decode logprob tokens alike.
"""

from __future__ import annotations

from typing import Protocol

from ..logprobs import Logprob, PromptLogprobs, decode_entry, make_decoder
from ..outputs import CompletionOutput, RequestMetrics, RequestOutput
from ..request import RequestStatus
from ..sampling_params import RequestOutputKind, SamplingParams
from .detokenizer import IncrementalDetokenizer
from .logprobs_state import LogprobsState


class Sample(Protocol):
    """What output processing reads of one sequence (a `Request`)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    output_token_ids: list[int]
    status: RequestStatus
    stop_reason: int | str | None
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    num_cached_tokens: int

    @property
    def is_finished(self) -> bool: ...


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._sent: dict[str, tuple[int, int]] = {}  # chars, tokens already sent
        self._logprobs: dict[str, LogprobsState] = {}
        self._decode = make_decoder(tokenizer)

    @property
    def num_requests(self) -> int:
        """Requests whose output state is kept (each until it finishes or
        is aborted)."""
        return len(self._sent)

    def add_request(self, req: Sample) -> None:
        if req.sampling_params.detokenize:
            self._detok[req.request_id] = IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, req.sampling_params)
        self._sent[req.request_id] = (0, 0)
        sp = req.sampling_params
        if sp.logprobs is not None or sp.prompt_logprobs is not None:
            self._logprobs[req.request_id] = LogprobsState(
                sp, self._decode if sp.detokenize else None)

    def record_logprobs(self, runner_out, updated: list) -> None:
        """Keeps the step's logprobs of requests that asked: sampled-token
        rows only for requests that got their token (``updated``)."""
        for rid, (first, rows) in runner_out.prompt_logprobs.items():
            state = self._logprobs.get(rid)
            if state is not None:
                state.add_prompt(first, rows)
        for req in updated:
            rows = runner_out.logprobs.get(req.request_id)
            state = self._logprobs.get(req.request_id)
            if rows is not None and state is not None:
                state.add_sample(rows)

    def record_entry(self, req: Sample, entry: dict[int, Logprob],
                     token_id: int) -> None:
        """One sampled token's logprobs as an engine core sent them
        (undecoded), for a request that asked."""
        state = self._logprobs.get(req.request_id)
        if state is not None:
            state.add_entry(entry, token_id)

    def decode_prompt_logprobs(self, req: Sample, entries: PromptLogprobs
                               ) -> PromptLogprobs:
        """An engine core's prompt logprobs with their tokens decoded (in
        place), when the request shows text."""
        if req.sampling_params.detokenize:
            for entry in entries:
                if entry is not None:
                    decode_entry(entry, self._decode)
        return entries

    def abort_requests(self, request_ids) -> None:
        """Drops the state of requests that end without a final output."""
        for rid in request_ids:
            self._detok.pop(rid, None)
            self._sent.pop(rid, None)
            self._logprobs.pop(rid, None)

    def detokenize(self, req: Sample, new_tokens: int = 1) -> bool:
        """Feeds the request's newest tokens to its detokenizer; returns True
        when a stop string matched (the caller then finishes the request)."""
        detok = self._detok.get(req.request_id)
        if detok is None:
            return False
        for tok in req.output_token_ids[len(req.output_token_ids) - new_tokens:]:
            if detok.step(tok):
                req.stop_reason = detok.stop_reason
                return True
        return False

    def make_output(self, req: Sample) -> RequestOutput | None:
        """The output to emit now; None when its output_kind says not yet."""
        sp = req.sampling_params
        finished = req.is_finished
        if sp.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        detok = self._detok.get(req.request_id)
        text = detok.visible_text(finished) if detok else ""
        token_ids = req.output_token_ids
        ntok = 0
        delta = sp.output_kind == RequestOutputKind.DELTA
        if delta:
            chars, ntok = self._sent[req.request_id]
            self._sent[req.request_id] = (len(text), len(token_ids))
            text, token_ids = text[chars:], token_ids[ntok:]
        lp_state = self._logprobs.get(req.request_id)
        logprobs = cumulative = prompt_logprobs = None
        if lp_state is not None:
            logprobs, cumulative = lp_state.sample_output(ntok)
            prompt_logprobs = lp_state.prompt_output(delta)
        completion = CompletionOutput(
            index=0, text=text, token_ids=list(token_ids),
            cumulative_logprob=cumulative, logprobs=logprobs,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason)
        metrics = RequestMetrics(
            arrival_time=req.arrival_time,
            first_scheduled_time=req.first_scheduled_time,
            first_token_time=req.first_token_time,
            last_token_time=req.last_token_time,
            finished_time=req.finished_time)
        if finished:
            self._detok.pop(req.request_id, None)
            self._sent.pop(req.request_id, None)
            self._logprobs.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids, outputs=[completion],
            finished=finished, metrics=metrics, prompt_logprobs=prompt_logprobs,
            num_cached_tokens=req.num_cached_tokens)
