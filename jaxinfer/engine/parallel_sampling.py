"""``n > 1``: the samples of one request are n ordinary requests.

The request runs as n child requests (ids ``"{i}_{request_id}"``, as vLLM
V1), queued together. They share the prompt's full pages through the prefix
cache: child 0's pages are registered when it is scheduled, so the others,
admitted right after it, find them (the last, partly filled page and each
child's own tokens are private). Nothing is forked mid-step, and no page is
ever written while shared.

Seeded requests give child i the seed ``seed + i`` (vLLM's rule). Outputs are
merged per parent by `ParentRequest.merge`.

``best_of > n``: best_of children run as above (each tracking its cumulative
logprob), and the parent emits once, when all have finished, the n with the
highest cumulative logprob (vLLM's rule), re-indexed 0..n-1.
"""

from __future__ import annotations

import dataclasses

from ..logprobs import PromptLogprobs
from ..outputs import CompletionOutput, RequestOutput
from ..request import Request
from ..sampling_params import RequestOutputKind, SamplingParams


def child_id(index: int, request_id: str) -> str:
    """The id of sample ``index`` of a request."""
    return f"{index}_{request_id}"


def parent_id(request_id: str) -> str | None:
    """The request a `child_id` belongs to; None for an id of another
    form."""
    head, sep, rest = request_id.partition("_")
    return rest if sep and head.isdigit() and rest else None


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    seed = None if params.seed is None else params.seed + index
    logprobs = params.logprobs
    if params.num_samples > params.n and logprobs is None:
        logprobs = 0  # the ranking needs each sample's cumulative logprob
    kind = params.output_kind
    if params.num_samples > params.n:
        # The parent keeps each child's latest output and ranks them at the
        # end: they must be whole, not the last delta (the server asks for
        # DELTA outputs).
        kind = RequestOutputKind.FINAL_ONLY
    child = dataclasses.replace(params, n=1, best_of=None, seed=seed,
                                logprobs=logprobs, output_kind=kind)
    child._bad_words_token_ids = params.bad_words_token_ids
    child.set_compiled_grammar(params.compiled_grammar)
    return child


def make_child(req: Request, index: int, params: SamplingParams) -> Request:
    child = Request(child_id(index, req.request_id), req.prompt_token_ids,
                    child_params(params, index), req.eos_token_ids,
                    arrival_time=req.arrival_time, priority=req.priority,
                    prompt=req.prompt, extra_keys=req.extra_keys,
                    mm_inputs=req.mm_inputs,
                    lora_request=req.lora_request)
    child.max_tokens = req.max_tokens
    return child


class ParentRequest:
    def __init__(self, request_id: str, params: SamplingParams):
        self.request_id = request_id
        self.n = params.num_samples  # children
        self.keep = params.n  # outputs returned
        self.user_logprobs = params.logprobs is not None
        # best_of: nothing to show before every sample is ranked.
        self.kind = (params.output_kind if self.keep == self.n
                     else RequestOutputKind.FINAL_ONLY)
        self.completions: dict[int, CompletionOutput] = {}
        self.finished: set[int] = set()
        self.prompt_logprobs: PromptLogprobs | None = None  # child 0's (only it scores the prompt)

    def merge(self, index: int, out: RequestOutput) -> RequestOutput | None:
        """One child's output -> the parent's output to emit (or None)."""
        comp = out.outputs[0]
        comp.index = index
        self.completions[index] = comp
        if out.finished:
            self.finished.add(index)
        done = len(self.finished) == self.n
        delta = self.kind == RequestOutputKind.DELTA
        if index == 0:
            self.prompt_logprobs = out.prompt_logprobs
        prompt_lp = out.prompt_logprobs if index == 0 or delta else \
            self.prompt_logprobs
        if self.kind == RequestOutputKind.FINAL_ONLY and not done:
            return None
        if delta:
            outputs = [comp]
        elif self.keep < self.n:
            outputs = self._best()
        else:
            outputs = [self.completions[i] for i in sorted(self.completions)]
        return dataclasses.replace(out, request_id=self.request_id,
                                   outputs=outputs, finished=done,
                                   prompt_logprobs=prompt_lp)

    def _best(self) -> list[CompletionOutput]:
        ranked = sorted(self.completions.values(), key=_cumulative_logprob,
                        reverse=True)
        best = []
        for i, comp in enumerate(ranked[:self.keep]):
            comp = dataclasses.replace(comp, index=i)
            if not self.user_logprobs:  # asked for by us, for the ranking
                comp.logprobs = None
            best.append(comp)
        return best


def _cumulative_logprob(comp: CompletionOutput) -> float:
    if comp.cumulative_logprob is None:  # child_params asks for logprobs
        raise RuntimeError(f"sample {comp.index} of a best_of request has "
                           "no cumulative logprob to rank it by")
    return comp.cumulative_logprob


class ParallelSampling:
    """The engine's bookkeeping for requests with n > 1 (or best_of > 1)."""

    def __init__(self):
        self.parents: dict[str, ParentRequest] = {}  # by parent id
        self.child_of: dict[str, tuple[ParentRequest, int]] = {}

    def add(self, req: Request) -> list[Request]:
        """The requests to schedule: ``[req]`` for n = 1, else its n
        children."""
        params = req.sampling_params
        if params.num_samples == 1:
            return [req]
        if req.request_id in self.parents:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        parent = ParentRequest(req.request_id, params)
        self.parents[req.request_id] = parent
        children = [make_child(req, i, params)
                    for i in range(params.num_samples)]
        for i, c in enumerate(children):
            self.child_of[c.request_id] = (parent, i)
        return children

    def expand(self, request_ids) -> list[str]:
        """Parent ids -> their children's ids."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        out = []
        for rid in request_ids:
            parent = self.parents.pop(rid, None)
            if parent is None:
                out.append(rid)
                continue
            for i in range(parent.n):
                self.child_of.pop(child_id(i, rid), None)
                out.append(child_id(i, rid))
        return out

    def merge(self, out: RequestOutput | None) -> RequestOutput | None:
        if out is None or out.request_id not in self.child_of:
            return out
        parent, index = self.child_of[out.request_id]
        merged = parent.merge(index, out)
        if merged is not None and merged.finished:
            self.parents.pop(parent.request_id, None)
            for i in range(parent.n):
                self.child_of.pop(child_id(i, parent.request_id), None)
        return merged
