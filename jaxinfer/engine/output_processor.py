"""Turns updated requests into vLLM `RequestOutput`s (text, stops, kinds)."""

from __future__ import annotations

from ..outputs import CompletionOutput, RequestMetrics, RequestOutput
from ..request import Request
from ..sampling_params import RequestOutputKind
from .detokenizer import IncrementalDetokenizer


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._sent: dict[str, tuple[int, int]] = {}  # chars, tokens already sent

    def add_request(self, req: Request) -> None:
        if req.sampling_params.detokenize:
            self._detok[req.request_id] = IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, req.sampling_params)
        self._sent[req.request_id] = (0, 0)

    def detokenize(self, req: Request, new_tokens: int = 1) -> bool:
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

    def make_output(self, req: Request) -> RequestOutput | None:
        """The output to emit now; None when its output_kind says not yet."""
        sp = req.sampling_params
        finished = req.is_finished
        if sp.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        detok = self._detok.get(req.request_id)
        text = detok.visible_text(finished) if detok else ""
        token_ids = req.output_token_ids
        if sp.output_kind == RequestOutputKind.DELTA:
            chars, ntok = self._sent[req.request_id]
            self._sent[req.request_id] = (len(text), len(token_ids))
            text, token_ids = text[chars:], token_ids[ntok:]
        completion = CompletionOutput(
            index=0, text=text, token_ids=list(token_ids),
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason)
        metrics = RequestMetrics(
            arrival_time=req.arrival_time,
            first_scheduled_time=req.first_scheduled_time,
            first_token_time=req.first_token_time,
            finished_time=req.finished_time)
        if finished:
            self._detok.pop(req.request_id, None)
            self._sent.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids, outputs=[completion],
            finished=finished, metrics=metrics,
            num_cached_tokens=req.num_cached_tokens)
