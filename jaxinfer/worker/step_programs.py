"""The jitted programs a step runs on the device: `forward` (one forward
pass over the step's tokens) then `sample_step` (sampling its logits), and
`multi_step` (a window of decode steps, each one's tokens the next one's
inputs). `ModelRunner`
packs their inputs on the host and keeps their compiled forms.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models.runtime import merge_encoder_outputs, run_model

from .logprob_ops import gather_logprobs
from .packing import unpack_lora_slots, unpack_step
from .penalties import update_penalty_state
from .sampler import SamplerOutput, SamplingMetadata, sample


def forward(model, dims, params, kv_pages, constants, prev_tokens, packed,
            logits_indices, mm=None, lora_pool=None, *, logits_sharding=None):
    """A step's forward pass: returns (logits [len(logits_indices), V]
    float32, updated kv_pages). logits_indices [S + Tp]: the S sampled rows,
    then Tp rows whose logits score prompt tokens (prompt logprobs).
    prev_tokens [max_num_seqs]: the previous step's sampled tokens, still on
    the device; an input id -1 - r stands for its row r (a token the host
    has not read yet). mm: None, or (encoder cache, mm_index [T]) when image
    placeholders are among the tokens (their embeddings come from the
    cache). ``lora_pool``: the LoRA adapter slots, given only when a row
    uses an adapter (then ``packed`` ends with each token's slot).
    ``logits_sharding``: where the logits are placed (the sampler's
    programs are compiled for it).

    The forward pass and `sample_step` are separate programs: the sampling
    variants (greedy, sampled, filtered, logprobs, penalties) all share one
    forward program per bucket, which holds nearly all of a step's build
    time (its attention kernels' lowering and XLA's compile of every layer),
    and the sampler's programs depend on S alone."""
    # packed: token ids, positions and attention metadata in one int32
    # buffer (one host->device transfer); dims = (T, S, P, decode_only): the
    # bucket and the metadata's static flag.
    input_ids, positions, md = unpack_step(packed, dims)
    input_ids = jnp.where(input_ids < 0,
                          prev_tokens[jnp.maximum(-1 - input_ids, 0)],
                          input_ids)
    inputs_embeds = None if mm is None else merge_encoder_outputs(
        model, params, input_ids, *mm)
    lora = None
    if lora_pool is not None:
        lora = (lora_pool, unpack_lora_slots(packed, dims))
    logits, kv_pages = run_model(model, params, constants, kv_pages, input_ids,
                                 positions, md, logits_indices, inputs_embeds,
                                 lora=lora)
    if logits_sharding is not None:
        logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
    return logits, kv_pages


def sample_step(num_logprobs, logits, penalty_state, prev_tokens,
                smd: SamplingMetadata, prompt_lp_targets):
    """Sampling over `forward`'s logits: the first S rows are sampled, the
    rest score ``prompt_lp_targets`` [Tp] (None: no prompt logprobs).
    ``num_logprobs`` (static): None, or the top-K to return. Returns
    (SamplerOutput, prompt logprobs or None, penalty_state, this step's
    tokens padded to prev_tokens' length)."""
    S = logits.shape[0] - (0 if prompt_lp_targets is None
                           else prompt_lp_targets.shape[0])
    if smd.penalties is not None:
        penalty_state = update_penalty_state(penalty_state, smd.penalties)
    out = sample(logits[:S], smd, penalty_state, num_logprobs)
    prompt_lp = None
    if prompt_lp_targets is not None:
        prompt_lp = gather_logprobs(logits[S:], prompt_lp_targets, num_logprobs)
    next_tokens = jnp.zeros_like(prev_tokens).at[:S].set(out.token_ids)
    return out, prompt_lp, penalty_state, next_tokens


def step(model, num_logprobs, dims, params, kv_pages, penalty_state, constants,
         prev_tokens, packed, logits_indices, smd: SamplingMetadata,
         prompt_lp_targets, mm=None, lora_pool=None):
    """`forward` then `sample_step` as one function (the engine runs them as
    two programs; benchmarks time the whole step as one). Returns (out,
    prompt_lp, kv_pages, penalty_state, next_tokens)."""
    logits, kv_pages = forward(model, dims, params, kv_pages, constants,
                               prev_tokens, packed, logits_indices, mm,
                               lora_pool)
    out, prompt_lp, penalty_state, next_tokens = sample_step(
        num_logprobs, logits, penalty_state, prev_tokens, smd,
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


def multi_step(model, block_size, num_steps, dims, params, kv_pages,
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
    input_ids, positions, md = unpack_step(packed, dims)
    input_ids = jnp.where(input_ids < 0,
                          prev_tokens[jnp.maximum(-1 - input_ids, 0)],
                          input_ids)
    lora = None
    if lora_pool is not None:
        lora = (lora_pool, unpack_lora_slots(packed, dims))
    S, P = md.block_tables.shape
    T = input_ids.shape[0]  # >= S: decode buckets may pad tokens past rows
    rows = jnp.arange(S, dtype=jnp.int32)
    # Token t < num_seqs is row t's (one token per row); the rest is padding,
    # which keeps the null page, as do rows without a sequence.
    tok = jnp.arange(T, dtype=jnp.int32)
    real_tok = tok < md.num_seqs[0]
    tok_row = jnp.minimum(tok, S - 1)
    real_row = rows < md.num_seqs[0]

    def one_step(carry):
        i, kv_pages, ids, tokens, running = carry
        i = jnp.asarray(i, jnp.int32)
        pos = jnp.where(real_tok, positions + i, 0)
        page = md.block_tables[tok_row, jnp.minimum(pos // block_size, P - 1)]
        md_i = dataclasses.replace(
            md, slot_mapping=jnp.where(real_tok, page * block_size + pos % block_size, 0),
            kv_lens=jnp.where(real_row, md.kv_lens + i, 0))
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
