"""Which running requests get draft tokens this step, and which drafts
(the scheduler's side of speculative decoding; no JAX).

N-gram drafts are looked up here. A draft model's drafts are decoded by
the runner once the step's pages are allocated
(`spec_decode/draft_model.py`): here each drafted row gets placeholders,
which the runner overwrites before the step is laid out.

A request is drafted for when its next step is a plain decode (its last
token not yet computed; for n-gram lookup, every token known) and nothing it samples under
depends on the tokens before it on the host: penalties, bad words and
min_tokens count every sampled token when the step is laid out, so such
requests decode one token per step. Drafts never run past ``max_tokens``
(the context's room included).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..request import Request, RequestStatus
from ..spec_decode.config import SpeculativeConfig
from ..spec_decode.ngram import propose_ngram

# A draft model's token before the runner decodes it (any valid id would
# do: the runner replaces every one).
DRAFT_PLACEHOLDER = 0


class Speculation:
    def __init__(self, config: SpeculativeConfig):
        self.config = config

    def eligible(self, req: Request) -> bool:
        # A drafter on the device drafts from a pending token too (the step
        # before still in flight: spec_decode/overlap.py); n-gram lookup
        # needs every token on the host.
        if req.num_pending_tokens and not self.config.uses_draft_model:
            return False
        return (req.status == RequestStatus.RUNNING
                and req.num_computed_tokens + 1 == req.num_tokens_with_pending
                and req.pooling_params is None and req.grammar is None
                and not req.needs_known_tokens)

    def _limit(self, req: Request) -> int:
        k = self.config.num_speculative_tokens
        if req.max_tokens is None:
            return k
        # The step emits up to d + 1 tokens, after the pending ones (all of
        # a step in flight's drafts counted as accepted).
        return max(0, min(k, req.max_tokens - len(req.output_token_ids)
                          - req.num_pending_tokens - 1))

    def propose(self, running: Iterable[Request]) -> dict[str, list[int]]:
        """request id -> its draft tokens (requests without any left out)."""
        reqs = [r for r in running if self.eligible(r)]
        reqs = [r for r in reqs if self._limit(r) > 0]
        if not reqs:
            return {}
        cfg = self.config
        if cfg.uses_draft_model:
            return {r.request_id: [DRAFT_PLACEHOLDER] * self._limit(r)
                    for r in reqs}
        drafts = propose_ngram([r.all_token_ids for r in reqs],
                               [self._limit(r) for r in reqs],
                               cfg.prompt_lookup_min, cfg.prompt_lookup_max)
        return {r.request_id: d for r, d in zip(reqs, drafts) if d}
