"""Host side of sampling: one step's requests -> `SamplingMetadata` arrays.

Runs once per step over the scheduled requests (O(requests + new tokens),
never O(vocabulary)), from the step's rows and what the runner was sent of
each request when it joined the batch (`NewRequestData`), never from the
scheduler's own request objects. Features no request uses stay None, which selects a
cheaper compiled variant of the step. Also plans prompt logprobs: which
positions of the step's tokens need them and which prompt token each one
scores.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from ..core.scheduler_output import NewRequestData, ScheduledRequest
from ..logprobs import LogprobRows
from .penalties import PenaltyParams
from .runner_output import ModelRunnerOutput
from .sampler import SamplerOutput, SamplingMetadata


def _pow2(n: int, floor: int = 1) -> int:
    v = floor
    while v < n:
        v *= 2
    return v


# Id lists (allowed, banned, biased) pad to a power of two of at least this
# many: each width is its own compiled step, and a [S, 16] scatter costs no
# more than a [S, 1] one, so short lists share one program.
LIST_WIDTH_FLOOR = 16


def _pad_lists(rows: list[list[int]], S: int, pad: int, dtype=np.int32,
               floor: int = LIST_WIDTH_FLOOR) -> np.ndarray:
    width = _pow2(max((len(r) for r in rows), default=1), floor)
    out = np.full((S, width), pad, dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


class PenaltySlots:
    """Which row of the device `PenaltyState` each penalized request holds."""

    def __init__(self, max_num_seqs: int):
        self.scratch = max_num_seqs  # the extra last row
        self._free = list(range(max_num_seqs - 1, -1, -1))
        self._slot: dict[str, int] = {}

    @property
    def rows(self) -> int:
        return self.scratch + 1

    def acquire(self, request_id: str, live: dict) -> tuple[int, bool]:
        """(slot, fresh): fresh slots must be reset and refilled."""
        slot = self._slot.get(request_id)
        if slot is not None:
            return slot, False
        if not self._free:  # only if finished ids were missed: reclaim
            for rid in [r for r in self._slot if r not in live]:
                self.release(rid)
        slot = self._free.pop()
        self._slot[request_id] = slot
        return slot, True

    def release(self, request_id: str) -> None:
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)


@dataclasses.dataclass
class PromptLogprobPlan:
    """Prompt logprob rows of one step: request id -> (first prompt index
    scored, start row, row count) into the step's prompt-logprob rows."""
    indices: np.ndarray  # [Tp] flat token index whose logits score a token
    targets: np.ndarray  # [Tp] the prompt token scored
    spans: dict[str, tuple[int, int, int]]


def _has_penalties(sp) -> bool:
    return (sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0
            or sp.repetition_penalty != 1.0)


class SamplingInputs:
    def __init__(self, vocab_size: int, max_num_seqs: int, engine_seed: int):
        self.vocab = vocab_size
        self.engine_seed = engine_seed
        self.slots = PenaltySlots(max_num_seqs)

    def request_seed(self, request_id: str, sp) -> int:
        if sp.seed is not None:
            return sp.seed & 0xFFFFFFFF
        return zlib.crc32(f"{self.engine_seed}:{request_id}".encode())

    def release(self, request_ids) -> None:
        for rid in request_ids:
            self.slots.release(rid)

    def build(self, sched: list[ScheduledRequest],
              requests: dict[str, NewRequestData], S: int) -> SamplingMetadata:
        """``requests``: what the runner knows of each request (sent once,
        when it joined the batch); the rows carry the rest."""
        reqs = [requests[s.request_id] for s in sched]
        sps = [r.sampling_params for r in reqs]
        n = len(reqs)
        V = self.vocab
        kw = {}
        if any(not sp.greedy for sp in sps):
            temp = np.zeros(S, np.float32)
            seeds = np.zeros(S, np.uint32)
            pos = np.zeros(S, np.int32)
            for i, (s, sp) in enumerate(zip(sched, sps)):
                temp[i] = 0.0 if sp.greedy else sp.temperature
                seeds[i] = self.request_seed(s.request_id, sp)
                pos[i] = s.sample_index
            kw.update(temperature=temp, seeds=seeds, positions=pos)
            if any(sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p > 0.0
                   for sp in sps):
                # The three filters travel together (off values where unused):
                # one compiled variant, which warm-up covers, instead of
                # seven; an unused filter costs little (sampler-h200.json).
                kw["top_k"] = np.pad(np.array([max(sp.top_k, 0) for sp in sps],
                                              np.int32), (0, S - n))
                kw["top_p"] = np.pad(np.array([sp.top_p for sp in sps],
                                              np.float32), (0, S - n),
                                     constant_values=1.0)
                kw["min_p"] = np.pad(np.array([sp.min_p for sp in sps],
                                              np.float32), (0, S - n))
        if (any(sp.allowed_token_ids or sp.logit_bias for sp in sps)
                or any(s.banned_ids for s in sched)):
            # The three id lists travel together (empty rows where unused:
            # all-pad allowed rows mean no limit): one compiled variant for
            # any mix of them instead of seven.
            kw["allowed_ids"] = _pad_lists(
                [sp.allowed_token_ids or [] for sp in sps], S, V)
            kw["banned_ids"] = _pad_lists([s.banned_ids for s in sched], S, V)
            items = [list((sp.logit_bias or {}).items()) for sp in sps]
            kw["bias_ids"] = _pad_lists([[k for k, _ in it] for it in items], S, V)
            kw["bias_values"] = _pad_lists([[v for _, v in it] for it in items],
                                           S, 0.0, np.float32)
        if any(_has_penalties(sp) for sp in sps):
            kw["penalties"] = self._penalties(sched, reqs, requests, S)
        return SamplingMetadata(**kw)

    def _penalties(self, sched, reqs, requests, S) -> PenaltyParams:
        scratch = self.slots.scratch
        slots = np.full(S, scratch, np.int32)
        reset = np.full(S, scratch, np.int32)
        pres = np.zeros(S, np.float32)
        freq = np.zeros(S, np.float32)
        rep = np.ones(S, np.float32)
        ids, cslots, is_out = [], [], []
        for i, (s, req) in enumerate(zip(sched, reqs)):
            sp = req.sampling_params
            if not _has_penalties(sp):
                continue
            slot, fresh = self.slots.acquire(req.request_id, requests)
            slots[i] = slot
            pres[i], freq[i] = sp.presence_penalty, sp.frequency_penalty
            rep[i] = sp.repetition_penalty
            start = s.start_pos
            toks = list(s.token_ids)
            if fresh:  # a request (re)joining: every token before this chunk
                reset[i] = slot
                toks = req.token_ids[:start] + toks
                start = 0
            ids.extend(toks)
            cslots.extend([slot] * len(toks))
            p = req.num_prompt_tokens
            is_out.extend(start + j >= p for j in range(len(toks)))
        C = _pow2(len(ids), 16)
        count_ids = np.full(C, self.vocab, np.int32)
        count_slots = np.full(C, scratch, np.int32)
        count_out = np.zeros(C, np.bool_)
        count_ids[:len(ids)] = ids
        count_slots[:len(ids)] = cslots
        count_out[:len(ids)] = is_out
        return PenaltyParams(slots, pres, freq, rep, reset, count_ids,
                             count_slots, count_out)

    @staticmethod
    def plan_prompt_logprobs(sched: list[ScheduledRequest],
                             requests: dict[str, NewRequestData]
                             ) -> PromptLogprobPlan | None:
        """Positions j of the step whose logits score prompt token j + 1."""
        idx, tgt, spans = [], [], {}
        t = 0
        for s in sched:
            req = requests[s.request_id]
            n = len(s.token_ids)
            if req.sampling_params.prompt_logprobs is not None:
                stop = min(s.start_pos + n, req.num_prompt_tokens - 1)
                if stop > s.start_pos:
                    spans[s.request_id] = (s.start_pos + 1, len(idx),
                                           stop - s.start_pos)
                    for j in range(s.start_pos, stop):
                        idx.append(t + j - s.start_pos)
                        tgt.append(req.token_ids[j + 1])
            t += n
        if not idx:
            return None
        Tp = _pow2(len(idx), 16)
        indices = np.zeros(Tp, np.int32)
        targets = np.zeros(Tp, np.int32)
        indices[:len(idx)] = idx
        targets[:len(tgt)] = tgt
        return PromptLogprobPlan(indices, targets, spans)

    @staticmethod
    def collect(sched: list[ScheduledRequest], wants_logprobs: list[bool],
                res: SamplerOutput, prompt_lp, plan: PromptLogprobPlan | None
                ) -> ModelRunnerOutput:
        """Device results -> host dicts keyed by request id (one transfer
        per array). ``wants_logprobs[i]``: row i's request asked for the
        sampled token's logprobs."""
        tokens = np.asarray(res.token_ids)
        if tokens.ndim == 2:  # a multi-step decode: [steps, S], rows' tokens in order
            return ModelRunnerOutput({s.request_id: tokens[:, i].tolist()
                                      for i, s in enumerate(sched) if s.sample})
        out = ModelRunnerOutput({s.request_id: int(tokens[i])
                                 for i, s in enumerate(sched) if s.sample})
        if res.logprobs is not None:
            rows = LogprobRows(np.asarray(res.logprobs.token_ids),
                               np.asarray(res.logprobs.logprobs),
                               np.asarray(res.logprobs.ranks))
            for i, s in enumerate(sched):
                if s.sample and wants_logprobs[i]:
                    out.logprobs[s.request_id] = rows.slice(i, i + 1)
        if plan is not None:
            rows = LogprobRows(np.asarray(prompt_lp.token_ids),
                               np.asarray(prompt_lp.logprobs),
                               np.asarray(prompt_lp.ranks))
            for rid, (first, start, count) in plan.spans.items():
                out.prompt_logprobs[rid] = (first, rows.slice(start, start + count))
        return out
