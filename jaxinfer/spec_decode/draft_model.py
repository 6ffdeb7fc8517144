"""A draft model's side of speculative decoding (``method: "draft_model"``):
a smaller model with the target's vocabulary proposes each drafted row's k
tokens by greedy decoding, on the same paged machinery as the target.

Its K/V pages are a pool of their own, indexed by the target's block
tables: page i of the draft's pool holds the draft's K/V of the tokens in
the target's page i. So the scheduler's one bookkeeping covers both:
allocation, rolling back rejected drafts, prefix-cache hits, preemption
and swapping (the runner copies the draft's pages beside the target's).

Per step, on the device:

1. `propose`: for each drafted row, the draft decodes k tokens from the
   row's first input (its last known token, at the row's start position),
   each one the next one's input, in one program. The K/V of the inputs it
   consumes land in the row's pages; writes past the row's d drafts go to
   the null page (the step's pages cover d + 1 tokens).
2. `place_inputs`: the drafts go into the target step's laid-out inputs on the
   device, over the scheduler's placeholders (the host never reads them:
   the target's step is enqueued behind the draft's with no wait).
3. The target's step verifies the drafts (`verify.py`).
4. `mirror`: the draft runs over the target's step inputs, as laid out, so
   its pages hold every token the target's hold (prompt chunks, and the
   verified row: its accepted drafts are then right, the rest is
   overwritten when those positions are computed again).

A draft is a deterministic proposal, so verification keeps the target's
distribution exactly (`verify.py`): the draft's quality only changes how
many drafts are accepted.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models import model_class, resolve_model
from jaxinfer.models.runtime import model_constants, run_model

from ..errors import InvalidConfigError, UnsupportedFeatureError
from ..worker.buckets import Bucket
from ..worker.kv_dtype import page_bytes
from ..worker.packing import pack_step, unpack_step
from ..worker.page_ops import PageMover
from ..worker.placement import Placement
from ..worker.step_functions import window_step
from ..worker.step_layout import lay_out_step
from ..worker.warmup import dummy_batch
from ..worker.weights import load_weights

logger = logging.getLogger(__name__)


def propose_greedy(model, block_size: int, num_steps: int, bucket, params,
                   kv_pages, constants, packed, num_drafts):
    """``num_steps`` greedy decode steps of every row from its one input
    token (``packed``: a decode-only step, one token per row, bucket
    ``bucket``). Step i's K/V lands at the row's position + i when i <
    ``num_drafts`` [S] (the row's drafts, whose pages the scheduler
    allocated), else in the null page. Returns (tokens [num_steps, S],
    kv_pages)."""
    input_ids, positions, md = unpack_step(packed, bucket)
    S = md.block_tables.shape[0]
    rows = jnp.arange(S, dtype=jnp.int32)
    # Each token's row's drafts (padding tokens: the last row's).
    tok_drafts = num_drafts[jnp.minimum(jnp.arange(input_ids.shape[0]), S - 1)]

    def one_step(i, carry):
        kv_pages, ids, tokens = carry
        pos, md_i = window_step(md, positions, i, block_size,
                                writes=i < tok_drafts)
        logits, kv_pages = run_model(model, params, constants, kv_pages, ids,
                                     pos, md_i, rows)
        new = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        ids = jnp.zeros_like(ids).at[:S].set(new)
        return kv_pages, ids, tokens.at[i].set(new)

    tokens = jnp.zeros((num_steps, S), jnp.int32)
    kv_pages, _, tokens = jax.lax.fori_loop(
        0, num_steps, one_step, (kv_pages, input_ids, tokens))
    return tokens, kv_pages


def inject_drafts(packed, drafts, tokens, token_index, draft_index):
    """``tokens`` [k, Sp] (the draft's, per proposal row) written into the
    step's packed inputs at ``token_index`` [Sp, k] and into its drafts
    [S, k] at the flat ``draft_index`` [Sp, k]; out-of-range indices (a
    row's unused drafts, padding rows) write nothing."""
    values = tokens.T.reshape(-1)
    packed = packed.at[token_index.reshape(-1)].set(values, mode="drop")
    flat = drafts.reshape(-1).at[draft_index.reshape(-1)].set(values,
                                                              mode="drop")
    return packed, flat.reshape(drafts.shape)


def mirror_step(model, bucket, params, kv_pages, constants, packed):
    """The draft's K/V of a target step's tokens (``packed`` as the target's
    step took it); its logits are not needed (and not computed: XLA drops
    the unused head)."""
    input_ids, positions, md = unpack_step(packed, bucket)
    _, kv_pages = run_model(model, params, constants, kv_pages, input_ids,
                            positions, md, jnp.zeros(1, jnp.int32))
    return kv_pages


@dataclasses.dataclass
class Proposal:
    """A step's drafts, still on the device."""
    tokens: jax.Array  # [k, Sp]: proposal row r's drafts in column r
    rows: list[int]  # the step row of each proposal row
    num_drafts: list[int]  # its drafts (the first this many of the k)


@dataclasses.dataclass
class _Row:
    """A drafted row's proposal input, in `lay_out_step`'s terms."""
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool = True


def proposal_inputs(scheduled, buckets, block_size: int, shift: int = 0,
                    prev_rows: dict[str, int] | None = None):
    """The decode-only step a proposal runs: each drafted row's first input
    token at its start position + ``shift`` (a pending token: its row in
    the step before, ``prev_rows``, read on the device). None when no row
    drafts; else (rows: their step rows, num_drafts per row, bucket, packed
    inputs, num_drafts padded to the bucket's S)."""
    rows = [i for i, s in enumerate(scheduled) if s.num_draft_tokens]
    if not rows:
        return None
    inputs = [_Row(scheduled[i].request_id, [scheduled[i].token_ids[0]],
                   scheduled[i].start_pos + shift, scheduled[i].block_table)
              for i in rows]
    bucket = buckets.bucket(len(inputs), len(inputs),
                            max(len(r.block_table) for r in inputs))
    input_ids, positions, md, _ = lay_out_step(inputs, bucket[:3], block_size,
                                               prev_rows or {}, True)
    num_drafts = [scheduled[i].num_draft_tokens for i in rows]
    padded = np.zeros(bucket.seqs, np.int32)
    padded[:len(rows)] = num_drafts
    return rows, num_drafts, bucket, pack_step(input_ids, positions, md), padded


def place_drafts(inject, replicated, proposal: Proposal | None, scheduled,
                 packed: np.ndarray, drafts):
    """(packed, drafts) of the laid-out step on the device, placed once
    for the target's programs and the drafter's pass alike; with the
    proposal's drafts written over the placeholders when rows draft
    (``inject``: `inject_drafts` jitted). A row's drafts are the last of
    its tokens, which the layout packs from the row's offset in the step
    (the input ids lead the buffer)."""
    if proposal is None:
        return jax.device_put(packed, replicated), drafts
    k, Sp = proposal.tokens.shape
    R = len(proposal.rows)
    ends = np.cumsum([len(s.token_ids) for s in scheduled])
    rows = np.asarray(proposal.rows)
    d = np.asarray(proposal.num_drafts)[:, None]
    j = np.arange(k)[None, :]
    real = j < d
    token_index = np.full((Sp, k), packed.size, np.int32)
    draft_index = np.full((Sp, k), drafts.size, np.int32)
    token_index[:R] = np.where(real, ends[rows][:, None] - d + j, packed.size)
    draft_index[:R] = np.where(real, rows[:, None] * k + j, drafts.size)
    return inject(packed, drafts, proposal.tokens, token_index, draft_index)


class PagedDrafter:
    """What a drafter whose pages ride the target's block tables (a draft
    model, an EAGLE head) shares: swapping its pages with the target's,
    enqueuing its proposal, placing the drafts into the step's inputs.
    Subclasses set the attributes below; ``proposal_shift``: where a
    row's proposal starts against its first input's position."""
    kv_pages: list | None
    page_mover: PageMover | None
    replicated: jax.sharding.Sharding
    block_size: int
    params: dict
    constants: dict
    _propose: Callable[..., Any]  # jitted: (bucket, params, pages, ...)
    _inject: Callable[..., Any]  # `inject_drafts` jitted
    proposal_shift = 0

    def copy_pages(self, out) -> None:
        """The step's swaps, applied to the drafter's pages as to the
        target's."""
        if self.page_mover is None:
            raise RuntimeError(f"{type(self).__name__}: pages not allocated")
        self.kv_pages = self.page_mover.apply(self.kv_pages, out)

    def propose(self, scheduled, buckets, prev_rows: dict[str, int],
                correct: Callable[..., Any] | None = None
                ) -> Proposal | None:
        """Enqueues the drafting of every drafted row (None: no row drafts
        this step). ``correct(rows, bucket, packed)``: the layout's
        correction on the device, when the step before is in flight
        (overlap.py)."""
        inputs = proposal_inputs(scheduled, buckets, self.block_size,
                                 self.proposal_shift, prev_rows)
        if inputs is None:
            return None
        rows, num_drafts, bucket, packed, padded = inputs
        if correct is not None:
            packed = correct(rows, bucket, packed)
        else:  # placed as the correction places it: one program serves
            packed = jax.device_put(packed, self.replicated)
        tokens, self.kv_pages = self._propose(
            bucket, self.params, self.kv_pages, self.constants, packed,
            padded)
        return Proposal(tokens, rows, num_drafts)

    def place_inputs(self, proposal: Proposal | None, scheduled,
                     packed: np.ndarray, drafts):
        """`place_drafts` with this drafter's programs."""
        return place_drafts(self._inject, self.replicated, proposal,
                            scheduled, packed, drafts)

    def mirror(self, bucket: Bucket, packed, hidden) -> None:
        """Runs the drafter over a target step's inputs (``packed`` as
        `place_inputs` placed it) and, for a drafter that reads them, the
        step's hidden states (enqueued; nothing is read back)."""
        raise NotImplementedError

    def warm_hidden(self, num_tokens: int):
        """Hidden states of a warm-up step of ``num_tokens`` tokens, placed
        as a step's come (None: the drafter reads none)."""
        return None

    def warm_up(self, buckets) -> int:
        """Builds the drafter's pass over every bucket a step can land in,
        and its proposal program for every decode-only one, by running
        each on a batch that writes only the null page. Returns how many
        programs that was. (Writing the drafts into a step's inputs, a
        program of a few scatters, builds on first use.)"""
        built = 0
        for bucket in buckets.all_shapes():
            T, S, P, decode_only = bucket[:4]
            input_ids, positions, md, _ = dummy_batch(T, S, P)
            packed = pack_step(input_ids, positions, md)
            self.mirror(bucket, jax.device_put(packed, self.replicated),
                        self.warm_hidden(T))
            built += 1
            if decode_only:
                _, self.kv_pages = self._propose(
                    bucket, self.params, self.kv_pages, self.constants,
                    jax.device_put(packed, self.replicated),
                    np.zeros(S, np.int32))
                built += 1
        jax.block_until_ready(self.kv_pages)
        return built


class DraftModel(PagedDrafter):
    """The draft's weights, K/V pool and programs, on the target's device."""

    def __init__(self, source: str, *, target_cfg, dtype, kv_dtype,
                 block_size: int, max_model_len: int, num_speculative_tokens:
                 int, load_format: str, seed: int, backend, devices,
                 tensor_parallel_size: int, pipeline_parallel_size: int):
        if tensor_parallel_size * pipeline_parallel_size > 1:
            raise UnsupportedFeatureError(
                "speculative_config.method='draft_model'",
                "a draft model beside tensor or pipeline parallelism",
                "run the target on one device, or use method 'ngram'")
        t0 = time.perf_counter()
        files = resolve_model(source, load_format)
        self.cfg = files.config
        if self.cfg.vocab_size != target_cfg.vocab_size:
            raise InvalidConfigError(
                f"speculative_config.model {source!r} has a vocabulary of "
                f"{self.cfg.vocab_size} tokens, the target "
                f"{target_cfg.vocab_size}: a draft must share the target's "
                "tokenizer")
        if getattr(self.cfg, "quantization", None):
            raise UnsupportedFeatureError(
                f"speculative_config.model={source!r}",
                "a quantized draft model", "use a float draft checkpoint")
        self.k = num_speculative_tokens
        self.block_size = block_size
        self.kv_dtype = kv_dtype
        self.model = model_class(self.cfg.architecture)(
            self.cfg, backend=backend, dtype=dtype)
        self.placement = Placement(self.model, self.cfg, 1, 1, devices)
        self.replicated = self.placement.replicated
        self.model = self.model.clone(mesh=self.placement.mesh)
        self.constants = model_constants(self.model, max_model_len)
        self.params = load_weights(files, self.model, self.cfg, dtype,
                                   self.placement, load_format, seed)
        logger.info("loaded the draft model %s (%.1fM params) in %.1fs",
                    source, self.cfg.num_params / 1e6,
                    time.perf_counter() - t0)
        self.kv_pages = None  # allocate() once the pool's size is known
        self.page_mover: PageMover | None = None
        # Outputs placed as the pages are allocated, so that every call of
        # a bucket, whatever placed its inputs, shares one program.
        self._propose = jax.jit(
            functools.partial(propose_greedy, self.model, block_size, self.k),
            static_argnums=(0,), donate_argnums=(2,),
            out_shardings=self.replicated)
        self._mirror = jax.jit(functools.partial(mirror_step, self.model),
                               static_argnums=(0,), donate_argnums=(2,),
                               out_shardings=self.replicated)
        # Placed as the step programs take their inputs.
        self._inject = jax.jit(inject_drafts, out_shardings=(
            self.placement.replicated, self.placement.replicated))

    @property
    def page_bytes(self) -> int:
        """Bytes of one of the draft's pages (all its layers, K and V)."""
        return page_bytes(self.cfg.num_layers, self.block_size,
                          self.cfg.num_kv_heads, self.cfg.head_dim,
                          self.kv_dtype, 1)

    def allocate(self, num_pages: int, num_host_pages: int) -> None:
        """The draft's K/V pool: as many pages as the target's."""
        # One device: its K/V heads' sharding is replication, labelled as
        # the programs place their outputs.
        self.kv_pages = jax.device_put(self.placement.zeros_kv(
            self.cfg.num_layers, num_pages, self.block_size, self.kv_dtype),
            self.replicated)
        self.page_mover = PageMover(num_pages, num_host_pages)

    def mirror(self, bucket: Bucket, packed, hidden=None) -> None:
        """The draft's pass over a target step's tokens (a draft model
        reads tokens only: ``hidden`` is None)."""
        self.kv_pages = self._mirror(bucket, self.params, self.kv_pages,
                                     self.constants, packed)
