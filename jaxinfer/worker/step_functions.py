"""The functions a step's programs trace: `forward` (one forward pass over
the step's tokens) then `sample_step` (sampling its logits) and, when
prompt logprobs are asked for, `prompt_logprobs`; `multi_step` (a window
of decode steps, each one's tokens the next one's inputs); `count_tokens`
(a fresh penalty slot's earlier tokens). `StepPrograms` jits them and
keeps their compiled forms.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models.runtime import merge_encoder_outputs, run_model, run_model_tapped

from .logprob_ops import gather_logprobs
from .packing import unpack_lora_slots, unpack_step
from .penalties import count_tokens, update_penalty_state
from .sampler import SamplerOutput, SamplingMetadata, sample


def forward(model, bucket, params, kv_pages, constants, prev_tokens, packed,
            logits_indices, mm=None, lora_pool=None, *, logits_sharding=None,
            rows_per_seq: int = 1, taps: tuple | None = None):
    """A step's forward pass: returns (logits [S, V] float32 of the sampled
    rows, logits [Tp, V] of the rows scoring prompt tokens or None, updated
    kv_pages). logits_indices [S + Tp]: the S sampled rows, then (prompt
    logprobs) Tp = T rows whose logits score prompt tokens.
    prev_tokens [max_num_seqs]: the previous step's sampled tokens, still on
    the device; an input id -1 - r stands for its row r (a token the host
    has not read yet). mm: None, or (encoder cache, mm_index [T]) when image
    placeholders are among the tokens (their embeddings come from the
    cache). ``lora_pool``: the LoRA adapter slots, given only when a row
    uses an adapter (then ``packed`` ends with each token's slot).
    ``logits_sharding``: where the logits are placed (the sampler's
    programs are compiled for it). ``rows_per_seq``: sampled rows per
    sequence (k + 1 under speculative decoding: its last token and each
    draft), so the sampled rows are the first S * rows_per_seq.
    ``taps`` (an EAGLE head's, `runtime.run_model_tapped`): the hidden
    states there of all T tokens are returned too, as a fourth output.

    The forward pass and `sample_step` are separate programs: the sampling
    variants (greedy, sampled, filtered, logprobs, penalties) all share one
    forward program per bucket, which holds nearly all of a step's build
    time (its attention kernels' lowering and XLA's compile of every layer),
    and the sampler's programs depend on S alone."""
    # packed: token ids, positions and attention metadata in one int32
    # buffer (one host->device transfer), laid out by the bucket (T, S, P,
    # decode_only: the metadata's static flag).
    input_ids, positions, md = unpack_step(packed, bucket)
    input_ids = jnp.where(input_ids < 0,
                          prev_tokens[jnp.maximum(-1 - input_ids, 0)],
                          input_ids)
    inputs_embeds = None if mm is None else merge_encoder_outputs(
        model, params, input_ids, *mm)
    lora = None
    if lora_pool is not None:
        lora = (lora_pool, unpack_lora_slots(packed, bucket))
    hidden = None
    if taps is None:
        logits, kv_pages = run_model(model, params, constants, kv_pages,
                                     input_ids, positions, md, logits_indices,
                                     inputs_embeds, lora=lora)
    else:
        logits, hidden, kv_pages = run_model_tapped(
            model, params, constants, kv_pages, input_ids, positions, md,
            logits_indices, taps, inputs_embeds, lora=lora)
    S = bucket.seqs * rows_per_seq
    parts = [logits[:S], logits[S:] if logits.shape[0] > S else None]
    if logits_sharding is not None:
        parts = [None if x is None else
                 jax.lax.with_sharding_constraint(x, logits_sharding)
                 for x in parts]
        if hidden is not None:  # placed as the head's programs take it
            hidden = jax.lax.with_sharding_constraint(hidden, logits_sharding)
    if taps is not None:
        return parts[0], parts[1], kv_pages, hidden
    return parts[0], parts[1], kv_pages


def sample_step(num_logprobs, logits, penalty_state, prev_tokens,
                smd: SamplingMetadata):
    """Sampling over `forward`'s sampled rows' logits [S, V].
    ``num_logprobs`` (static): None, or the top-K to return. Returns
    (SamplerOutput, penalty_state, this step's tokens padded to
    prev_tokens' length)."""
    S = logits.shape[0]
    if smd.penalties is not None:
        penalty_state = update_penalty_state(penalty_state, smd.penalties)
    out = sample(logits, smd, penalty_state, num_logprobs)
    next_tokens = jnp.zeros_like(prev_tokens).at[:S].set(out.token_ids)
    return out, penalty_state, next_tokens


def prompt_logprobs(num_logprobs, prompt_logits, targets):
    """Logprobs of ``targets`` [Tp] (the prompt tokens scored) and the
    top ``num_logprobs`` (static) under ``prompt_logits`` [Tp, V]."""
    return gather_logprobs(prompt_logits, targets, num_logprobs)


def count_penalty_tokens(penalty_state, reset_slots, count_ids, count_slots,
                         count_is_output):
    """`penalties.count_tokens` as a program of its own (fixed widths)."""
    return count_tokens(penalty_state, reset_slots, count_ids, count_slots,
                        count_is_output)


def step(model, num_logprobs, bucket, params, kv_pages, penalty_state,
         constants, prev_tokens, packed, logits_indices,
         smd: SamplingMetadata, prompt_lp_targets, mm=None, lora_pool=None):
    """`forward` then `sample_step` as one function (the engine runs them as
    two programs; benchmarks time the whole step as one). Returns (out,
    prompt_lp, kv_pages, penalty_state, next_tokens)."""
    logits, prompt_logits, kv_pages = forward(
        model, bucket, params, kv_pages, constants, prev_tokens, packed,
        logits_indices, mm, lora_pool)
    out, penalty_state, next_tokens = sample_step(
        num_logprobs, logits, penalty_state, prev_tokens, smd)
    prompt_lp = None
    if prompt_lp_targets is not None:
        prompt_lp = prompt_logprobs(num_logprobs, prompt_logits,
                                    prompt_lp_targets)
    return out, prompt_lp, kv_pages, penalty_state, next_tokens


# Stop ids per row a window checks on the device (more are the host's alone:
# the device then runs on to the window's end, and the host drops the rest).
WINDOW_STOP_IDS = 8


# How a window's steps are looped (static): "while" ends early once every
# row has stopped, but its condition is read back by the host each step on
# a GPU; "scan" runs all num_steps with a trip count XLA knows; "unroll"
# traces num_steps copies of the step into one straight program.
WINDOW_LOOPS = ("while", "scan", "unroll")


def window_stop_ids(sched, S: int, loop: str) -> np.ndarray | None:
    """[S, WINDOW_STOP_IDS] each row's first stop ids, padded with -1, for
    "while" windows; None for the other loops (they run to the end)."""
    if loop != "while":
        return None
    out = np.full((S, WINDOW_STOP_IDS), -1, np.int32)
    for i, s in enumerate(sched):
        ids = s.stop_ids[:WINDOW_STOP_IDS]
        out[i, :len(ids)] = ids
    return out


def window_step(md, positions, i, block_size: int, writes=None):
    """(positions [T], metadata) of step ``i`` of a window of decode steps
    over a decode-only layout (``positions``, ``md``): token t <
    num_seqs is row t's (the rest is padding), one position on per step,
    its K/V slot read from the row's block table. Padding tokens, tokens
    past the table and those where ``writes`` [T] (default: all) is False
    write to the null page; rows without a sequence attend to nothing."""
    S, P = md.block_tables.shape
    T = positions.shape[0]  # >= S: decode buckets may pad tokens past rows
    tok = jnp.arange(T, dtype=jnp.int32)
    real_tok = tok < md.num_seqs[0]
    pos = jnp.where(real_tok, positions + i, 0)
    col = pos // block_size
    page = md.block_tables[jnp.minimum(tok, S - 1), jnp.minimum(col, P - 1)]
    ok = real_tok & (col < P)
    if writes is not None:
        ok &= writes
    real_row = jnp.arange(S, dtype=jnp.int32) < md.num_seqs[0]
    return pos, dataclasses.replace(
        md, slot_mapping=jnp.where(ok, page * block_size + pos % block_size, 0),
        kv_lens=jnp.where(real_row, md.kv_lens + i, 0))


def multi_step(model, block_size, num_steps, bucket, params, kv_pages,
                constants, prev_tokens, packed, smd: SamplingMetadata,
                stop_ids, lora_pool=None, *, loop: str = "scan"):
    """Up to ``num_steps`` decode steps in one program (multi-step
    scheduling): every real row is one decode token; each step's sampled
    tokens are the next step's inputs, one position on, their K/V slots read
    from the block tables (the scheduler allocated the pages of the whole
    window). Sampling draws as the single steps would: each row's output
    index advances by one per step. With ``loop="while"`` the loop ends
    early once every row has sampled one of its ``stop_ids`` [S,
    WINDOW_STOP_IDS] (padding -1); the steps it skips leave zeros, which the
    host drops with every token after a stop, as it drops the tokens the
    other loops sample past a stop (they take ``stop_ids`` None). Returns
    (SamplerOutput with token_ids [num_steps, S], kv_pages, the last step's
    tokens padded as `step`'s)."""
    if (stop_ids is None) != (loop != "while"):
        raise ValueError(f"stop_ids are for while windows only, not {loop!r}")
    input_ids, positions, md = unpack_step(packed, bucket)
    input_ids = jnp.where(input_ids < 0,
                          prev_tokens[jnp.maximum(-1 - input_ids, 0)],
                          input_ids)
    lora = None
    if lora_pool is not None:
        lora = (lora_pool, unpack_lora_slots(packed, bucket))
    S = md.block_tables.shape[0]
    rows = jnp.arange(S, dtype=jnp.int32)
    real_row = rows < md.num_seqs[0]

    def one_step(carry):
        i, kv_pages, ids, tokens, running = carry
        i = jnp.asarray(i, jnp.int32)
        pos, md_i = window_step(md, positions, i, block_size)
        logits, kv_pages = run_model(model, params, constants, kv_pages, ids,
                                     pos, md_i, rows, lora=lora)
        smd_i = smd if smd.positions is None else dataclasses.replace(
            smd, positions=smd.positions + i)
        new = sample(logits, smd_i).token_ids
        if stop_ids is not None:
            running = running & ~jnp.any(new[:, None] == stop_ids, axis=1)
        ids = jnp.zeros_like(ids).at[:S].set(new)
        return i + 1, kv_pages, ids, tokens.at[i].set(new), running

    def more(carry):
        i, _, _, _, running = carry
        return (i < num_steps) & jnp.any(running)

    tokens = jnp.zeros((num_steps, S), jnp.int32)
    carry = (jnp.int32(0), kv_pages, input_ids, tokens, real_row)
    if loop == "while":
        carry = jax.lax.while_loop(more, one_step, carry)
    elif loop == "scan":
        carry = jax.lax.fori_loop(0, num_steps, lambda _, c: one_step(c), carry)
    elif loop == "unroll":
        for _ in range(num_steps):
            carry = one_step(carry)
    else:
        raise ValueError(f"loop must be one of {WINDOW_LOOPS}, not {loop!r}")
    _, kv_pages, _, tokens, _ = carry
    next_tokens = jnp.zeros_like(prev_tokens).at[:S].set(tokens[-1])
    return SamplerOutput(tokens, None), kv_pages, next_tokens
