"""Counts of drafted and accepted tokens since start, as vLLM's
``vllm:spec_decode_*`` counters report them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class SpecDecodeStats:
    num_spec_tokens: int  # k
    num_drafts: int = 0  # rows verified with at least one draft
    num_draft_tokens: int = 0  # draft tokens verified
    num_accepted_tokens: int = 0  # of which accepted
    # [k]: how often the draft at each position was accepted
    accepted_per_pos: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.num_spec_tokens

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """One row's verification: ``num_drafts`` > 0 drafted tokens, the
        first ``num_accepted`` of them accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / max(1, self.num_draft_tokens)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per drafted row: accepted drafts plus the one
        target token every step emits."""
        return 1.0 + self.num_accepted_tokens / max(1, self.num_drafts)

    @classmethod
    def merged(cls, parts: list[SpecDecodeStats | None]
               ) -> SpecDecodeStats | None:
        """Several replicas' counts summed (None when speculation is off)."""
        real = [p for p in parts if p is not None]
        if not real:
            return None
        out = cls(real[0].num_spec_tokens)
        for p in real:
            out.num_drafts += p.num_drafts
            out.num_draft_tokens += p.num_draft_tokens
            out.num_accepted_tokens += p.num_accepted_tokens
            out.accepted_per_pos = [a + b for a, b in
                                    zip(out.accepted_per_pos, p.accepted_per_pos)]
        return out
