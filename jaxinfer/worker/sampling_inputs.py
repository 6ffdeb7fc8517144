"""Host side of sampling: one step's requests -> `SamplingMetadata` arrays.

Runs once per step over the scheduled requests, from the step's rows and
what the runner was sent of each request when it joined the batch
(`NewRequestData`), never from the scheduler's own request objects. Also
plans prompt logprobs: which positions of the step's tokens need them and
which prompt token each one scores.

Nothing a request sends may shape a compiled program, so each step takes
one of two tiers, each with shapes known at start (`sampler_widths`):

- plain: greedy, sampled, or sampled with top-k / top-p / min-p; features
  no row uses stay None (a cheaper compiled variant) -- the common case.
- full: every feature present at once (off values where unused): the
  filters, one packed token mask [S, ceil(V / 32)] into which allowed ids,
  bans (bad words, min_tokens) and grammar masks are folded on the host,
  logit bias padded to a width of `sampler_widths.bias_widths`, penalties
  with count arrays of one fixed width, and top logprobs. Any row that
  needs one of them puts the step in this tier.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..core.scheduler_output import NewRequestData, ScheduledRequest
from ..logprobs import LogprobRows
from .penalties import PenaltyParams
from .runner_output import ModelRunnerOutput
from .sampler import SamplerOutput, SamplingMetadata
from .sampler_widths import bias_width, mask_words


def _pad_lists(rows: Sequence[Sequence[float] | np.ndarray], S: int,
               width: int, pad: float,
               dtype=np.int32) -> np.ndarray:
    out = np.full((S, width), pad, dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def _bits(ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(word index, bit) of each token id in a packed mask."""
    a = np.asarray(ids, np.int64)
    return a >> 5, (np.uint32(1) << (a & 31).astype(np.uint32))


class RowArrays(NamedTuple):
    """A request's request-shaped sampling inputs, as arrays."""
    bias_ids: np.ndarray  # [n] int32
    bias_values: np.ndarray  # [n] float32
    allowed: np.ndarray | None  # [words] uint32 packed mask, or None


@dataclasses.dataclass
class CountChunk:
    """Tokens counted into the penalty state before a step (a fresh slot's
    earlier tokens), in the fixed count width."""
    reset_slots: np.ndarray  # [max_num_seqs] int32 rows to zero first (scratch: none)
    count_ids: np.ndarray  # [C] int32 (V: padding)
    count_slots: np.ndarray  # [C] int32
    count_is_output: np.ndarray  # [C] bool


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


def needs_full_tier(sched: list[ScheduledRequest], sps,
                    wants_logprobs: Sequence[bool]) -> bool:
    """Whether a step's rows need the full sampler tier (module docstring)."""
    return (any(wants_logprobs)
            or any(sp.allowed_token_ids or sp.logit_bias or _has_penalties(sp)
                   for sp in sps)
            or any(s.banned_ids or s.constrained for s in sched))


def prompt_logprob_rows(T: int, scheduler_config) -> int:
    """Rows of a step's prompt-logprob logits for a token bucket of T rows
    (`SchedulerConfig.max_prompt_logprob_rows` at most)."""
    return min(T, scheduler_config.max_prompt_logprob_rows)


class SamplingInputs:
    def __init__(self, vocab_size: int, max_num_seqs: int, engine_seed: int,
                 count_width: int = 2048):
        self.vocab = vocab_size
        self.engine_seed = engine_seed
        self.slots = PenaltySlots(max_num_seqs)
        self.max_num_seqs = max_num_seqs
        # C of every penalty count array: a step's own tokens fit it (the
        # scheduler's max_num_batched_tokens).
        self.count_width = count_width
        # Fresh slots' earlier tokens, for the runner to count before the
        # step (`take_count_chunks`).
        self._chunks: list[CountChunk] = []
        # Per request, its logit bias as arrays and its allowed ids as a
        # packed mask row: built once, not at every step (a bias over the
        # whole vocabulary is tens of thousands of entries).
        self._rows: dict[str, RowArrays] = {}

    def request_seed(self, request_id: str, sp) -> int:
        if sp.seed is not None:
            return sp.seed & 0xFFFFFFFF
        return zlib.crc32(f"{self.engine_seed}:{request_id}".encode())

    def release(self, request_ids) -> None:
        for rid in request_ids:
            self.slots.release(rid)
            self._rows.pop(rid, None)

    def _row_arrays(self, request_id: str, sp) -> RowArrays:
        row = self._rows.get(request_id)
        if row is None:
            bias = sp.logit_bias or {}
            allowed = None
            if sp.allowed_token_ids:
                allowed = np.zeros(mask_words(self.vocab), np.uint32)
                words, bits = _bits(sp.allowed_token_ids)
                np.bitwise_or.at(allowed, words, bits)
            row = self._rows[request_id] = RowArrays(
                np.fromiter(bias.keys(), np.int32, len(bias)),
                np.fromiter(bias.values(), np.float32, len(bias)), allowed)
        return row

    def take_count_chunks(self) -> list[CountChunk]:
        """The counting the last `build` left to run before its step."""
        chunks, self._chunks = self._chunks, []
        return chunks

    def build(self, sched: list[ScheduledRequest],
              requests: dict[str, NewRequestData], S: int,
              wants_logprobs: Sequence[bool] = ()) -> SamplingMetadata:
        """``requests``: what the runner knows of each request (sent once,
        when it joined the batch); the rows carry the rest.
        ``wants_logprobs[i]``: row i returns top logprobs (full tier)."""
        reqs = [requests[s.request_id] for s in sched]
        sps = [r.sampling_params for r in reqs]
        if needs_full_tier(sched, sps, wants_logprobs):
            return self._full(sched, reqs, requests, S)
        kw: dict[str, Any] = {}  # SamplingMetadata's fields in use
        if any(not sp.greedy for sp in sps):
            kw.update(self._draw_rows(sched, sps, S))
            if any(sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p > 0.0
                   for sp in sps):
                # The three filters travel together (off values where unused):
                # one compiled variant, which warm-up covers, instead of
                # seven; an unused filter is cheap (docs/performance.md, "The sampler").
                kw.update(self._filters(sps, S))
        return SamplingMetadata(**kw)

    def _draw_rows(self, sched, sps, S) -> dict[str, np.ndarray]:
        temp = np.zeros(S, np.float32)
        seeds = np.zeros(S, np.uint32)
        pos = np.zeros(S, np.int32)
        for i, (s, sp) in enumerate(zip(sched, sps)):
            temp[i] = 0.0 if sp.greedy else sp.temperature
            seeds[i] = self.request_seed(s.request_id, sp)
            pos[i] = s.sample_index
        return dict(temperature=temp, seeds=seeds, positions=pos)

    @staticmethod
    def _filters(sps, S) -> dict[str, np.ndarray]:
        n = len(sps)
        return dict(
            top_k=np.pad(np.array([max(sp.top_k, 0) for sp in sps], np.int32),
                         (0, S - n)),
            top_p=np.pad(np.array([sp.top_p for sp in sps], np.float32),
                         (0, S - n), constant_values=1.0),
            min_p=np.pad(np.array([sp.min_p for sp in sps], np.float32),
                         (0, S - n)))

    def _full(self, sched, reqs, requests, S) -> SamplingMetadata:
        """Every feature present, each in its fixed shape."""
        sps = [r.sampling_params for r in reqs]
        rows = [self._row_arrays(s.request_id, sp) for s, sp in zip(sched, sps)]
        width = bias_width(max((len(r.bias_ids) for r in rows), default=0),
                           self.vocab)
        return SamplingMetadata(
            **self._draw_rows(sched, sps, S), **self._filters(sps, S),
            bias_ids=_pad_lists([r.bias_ids for r in rows], S, width,
                                self.vocab),
            bias_values=_pad_lists([r.bias_values for r in rows], S, width,
                                   0.0, np.float32),
            penalties=self._penalties(sched, reqs, requests, S),
            token_bitmask=self._token_mask(sched, sps, S))

    def _token_mask(self, sched: list[ScheduledRequest], sps, S: int
                    ) -> np.ndarray:
        """[S, words] int32: per row the tokens it may sample (its allowed
        ids) less its banned ids; all ones (every token) for rows without a
        limit and for the padding. A constrained row's grammar mask is
        ANDed in once the forward pass is enqueued
        (Scheduler.fill_token_masks)."""
        out = np.full((S, mask_words(self.vocab)), 0xFFFFFFFF, np.uint32)
        for i, (s, sp) in enumerate(zip(sched, sps)):
            if sp.allowed_token_ids:
                out[i] &= self._row_arrays(s.request_id, sp).allowed
            if s.banned_ids:
                words, bits = _bits(s.banned_ids)
                np.bitwise_and.at(out[i], words, ~bits)
        return out.view(np.int32)

    def _penalties(self, sched, reqs, requests, S) -> PenaltyParams:
        """Every row's penalties (off values and the scratch slot for rows
        without); the step's own tokens of penalized rows in the fixed
        count width. A row whose slot is fresh has it zeroed and its
        earlier tokens counted by `take_count_chunks` first."""
        scratch = self.slots.scratch
        slots = np.full(S, scratch, np.int32)
        pres = np.zeros(S, np.float32)
        freq = np.zeros(S, np.float32)
        rep = np.ones(S, np.float32)
        ids: list[int] = []
        cslots: list[int] = []
        is_out: list[bool] = []
        resets: list[int] = []
        earlier: tuple[list[int], list[int], list[bool]] = ([], [], [])
        for i, (s, req) in enumerate(zip(sched, reqs)):
            sp = req.sampling_params
            if not _has_penalties(sp):
                continue
            slot, fresh = self.slots.acquire(req.request_id, requests)
            slots[i] = slot
            pres[i], freq[i] = sp.presence_penalty, sp.frequency_penalty
            rep[i] = sp.repetition_penalty
            p = req.num_prompt_tokens
            if fresh:  # a request (re)joining: every token before this chunk
                resets.append(slot)
                before = req.token_ids[:s.start_pos]
                earlier[0].extend(before)
                earlier[1].extend([slot] * len(before))
                earlier[2].extend(j >= p for j in range(len(before)))
            ids.extend(s.token_ids)
            cslots.extend([slot] * len(s.token_ids))
            is_out.extend(s.start_pos + j >= p for j in range(len(s.token_ids)))
        if resets:
            self._count_chunks(resets, *earlier)
        count_ids, count_slots, count_out = self._count_arrays(ids, cslots,
                                                               is_out)
        none = np.full(S, scratch, np.int32)  # resets ran with the chunks
        return PenaltyParams(slots, pres, freq, rep, none, count_ids,
                             count_slots, count_out)

    def _count_arrays(self, ids, slots, is_out):
        C = self.count_width
        if len(ids) > C:
            raise RuntimeError(  # the scheduler's token budget bounds a step
                f"{len(ids)} tokens to count in one step, over {C}")
        count_ids = np.full(C, self.vocab, np.int32)
        count_slots = np.full(C, self.slots.scratch, np.int32)
        count_out = np.zeros(C, np.bool_)
        count_ids[:len(ids)] = ids
        count_slots[:len(ids)] = slots
        count_out[:len(ids)] = is_out
        return count_ids, count_slots, count_out

    def _count_chunks(self, resets, ids, slots, is_out) -> None:
        """Queues the fresh slots' resets and earlier tokens, C at a time."""
        reset = np.full(self.max_num_seqs, self.slots.scratch, np.int32)
        reset[:len(resets)] = resets
        C = self.count_width
        for start in range(0, max(len(ids), 1), C):
            chunk = self._count_arrays(ids[start:start + C],
                                       slots[start:start + C],
                                       is_out[start:start + C])
            self._chunks.append(CountChunk(reset, *chunk))
            reset = np.full(self.max_num_seqs, self.slots.scratch, np.int32)

    @staticmethod
    def plan_prompt_logprobs(sched: list[ScheduledRequest],
                             requests: dict[str, NewRequestData], Tp: int
                             ) -> PromptLogprobPlan | None:
        """Positions j of the step whose logits score prompt token j + 1,
        padded to ``Tp`` rows (`prompt_logprob_rows` of the step's token
        bucket: one compiled variant per bucket, whatever the prompts; the
        scheduler keeps the scored tokens within it)."""
        idx: list[int] = []
        tgt: list[int] = []
        spans: dict[str, tuple[int, int, int]] = {}
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
        if len(idx) > Tp:
            raise AssertionError(
                f"{len(idx)} prompt-logprob rows in a step that scores at "
                f"most {Tp}: the scheduler's prompt-logprob budget was not kept")
        indices = np.zeros(Tp, np.int32)
        targets = np.zeros(Tp, np.int32)
        indices[:len(idx)] = idx
        targets[:len(tgt)] = tgt
        return PromptLogprobPlan(indices, targets, spans)

    @staticmethod
    def _collect_verified(sched, wants_logprobs, res, tokens
                          ) -> ModelRunnerOutput:
        """A speculative step's rows: each emits its accepted drafts and
        one target token (spec_decode/verify.py), with a logprob row per
        emitted token when asked for."""
        accepted = np.asarray(res.num_accepted)
        width = tokens.shape[1]
        out = ModelRunnerOutput({}, verified={
            s.request_id: tokens[i, :accepted[i] + 1].tolist()
            for i, s in enumerate(sched) if s.sample})
        if res.logprobs is not None:
            rows = LogprobRows(np.asarray(res.logprobs.token_ids),
                               np.asarray(res.logprobs.logprobs),
                               np.asarray(res.logprobs.ranks))
            for i, s in enumerate(sched):
                if s.sample and wants_logprobs[i]:
                    out.logprobs[s.request_id] = rows.slice(
                        i * width, i * width + int(accepted[i]) + 1)
        return out

    @staticmethod
    def collect(sched: list[ScheduledRequest], wants_logprobs: list[bool],
                res: SamplerOutput, prompt_lp, plan: PromptLogprobPlan | None
                ) -> ModelRunnerOutput:
        """Device results -> host dicts keyed by request id (one transfer
        per array). ``wants_logprobs[i]``: row i's request asked for the
        sampled token's logprobs."""
        tokens = np.asarray(res.token_ids)
        verified = getattr(res, "num_accepted", None) is not None
        if tokens.ndim == 2 and not verified:
            # a multi-step decode: [steps, S], rows' tokens in order
            return ModelRunnerOutput({}, window={
                s.request_id: tokens[:, i].tolist()
                for i, s in enumerate(sched) if s.sample})
        if verified:
            out = SamplingInputs._collect_verified(sched, wants_logprobs,
                                                   res, tokens)
        else:
            out = ModelRunnerOutput({s.request_id: int(tokens[i])
                                     for i, s in enumerate(sched) if s.sample})
        if res.logprobs is not None and not verified:
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
