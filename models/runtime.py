"""The one call from the engine into a model.

A model owns the host-built tables it reads (RoPE cos/sin rows today; two
tables for a model with two RoPE bases): ``model_constants`` builds them
once per engine, and ``run_model`` hands them to the model beside its
params. ``inputs_embeds`` lets an encoder's outputs stand in for token
embeddings (``embed_tokens`` gives the embeddings to merge them into;
``encode_images`` and ``merge_encoder_outputs`` are that path for a model
that takes images); ``lora`` adds each token's LoRA adapter (``lora.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .attention import AttentionMetadata
from .lora import COLLECTION, lora_collection


def _apply(model: nn.Module, variables: dict, *args: Any, **kw: Any) -> Any:
    """``model.apply`` with no mutable collections: the output alone (flax's
    signature also allows an (output, updated state) pair)."""
    return model.apply(variables, *args, **kw)


def model_constants(model: nn.Module, max_model_len: int,
                    sharding: jax.sharding.Sharding | None = None) -> dict:
    """Device arrays of the model's constants for positions below
    ``max_model_len``; built once, passed to every ``run_model``.
    ``sharding``: where they live (a mesh's replicated sharding when the
    params span several devices: a program lowered ahead from their
    shapes and shardings must see them on the params' devices, and an
    uncommitted array's shape carries device 0 alone); None: the default
    device, uncommitted. Built from the host table in every process, as a
    multi-host mesh needs."""
    tables = model.constants(max_model_len)
    if sharding is None:
        return jax.tree_util.tree_map(jnp.asarray, tables)

    def place(table: Any) -> jax.Array:
        table = np.asarray(table)
        return jax.make_array_from_callback(table.shape, sharding,
                                            lambda index: table[index])
    return jax.tree_util.tree_map(place, tables)


def run_model(
    model: nn.Module,
    params: dict[str, Any],
    constants: dict,  # model_constants(model, max_model_len)
    kv_pages: list[tuple[jax.Array, ...]],  # L (k_pages, v_pages[, scales])
    input_ids: jax.Array,  # [T] int32
    positions: jax.Array,  # [T] int32
    md: AttentionMetadata,
    logits_indices: jax.Array,  # [S] int32
    inputs_embeds: jax.Array | None = None,  # [T, D]
    lora: tuple[dict, jax.Array] | None = None,  # (adapter pool, [T] slot ids)
) -> tuple[jax.Array, list[tuple[jax.Array, ...]]]:
    """-> (logits [S, V] float32, updated kv_pages). ``lora``: the device
    pool of LoRA adapters (``lora.py``'s layout) and each token's slot."""
    variables = {"params": params, "constants": constants}
    if lora is not None:
        variables[COLLECTION] = lora_collection(*lora)
    return _apply(model, variables, input_ids, positions, kv_pages, md,
                  logits_indices, inputs_embeds=inputs_embeds)


# The module whose output is the final-norm hidden state: every family's
# __call__ builds its last norm as a submodule of this name.
FINAL_NORM = "norm"


def embed_tokens(model: nn.Module, params: dict[str, Any],
                 input_ids: jax.Array) -> jax.Array:
    """[T] int32 -> [T, D]: the embeddings ``run_model`` would look up."""
    return _apply(model, {"params": params}, input_ids, method="embed")


def encode_images(model: nn.Module, params: dict[str, Any],
                  pixel_values: jax.Array) -> jax.Array:
    """[B, C, S, S] preprocessed images -> [B, tokens_per_image, D]: the
    embeddings that stand in for each image's placeholder tokens."""
    if not hasattr(model, "encode_images"):
        from .spec import ModelContractError
        raise ModelContractError(
            f"{type(model).__name__} has image inputs in its config but no "
            "encode_images(pixel_values) method")
    return _apply(model, {"params": params}, pixel_values,
                  method="encode_images")


def merge_encoder_outputs(model: nn.Module, params: dict[str, Any],
                          input_ids: jax.Array,
                          encoder_cache: jax.Array,  # [slots, N, D]
                          mm_index: jax.Array,  # [T] int32
                          ) -> jax.Array:
    """[T, D] inputs_embeds: the token embeddings, where ``mm_index >= 0``
    the encoder output row ``mm_index`` of the flattened cache instead."""
    text = embed_tokens(model, params, input_ids)
    rows = encoder_cache.reshape(-1, encoder_cache.shape[-1])
    image = jnp.take(rows, jnp.maximum(mm_index, 0), axis=0)
    return jnp.where((mm_index >= 0)[:, None], image.astype(text.dtype), text)


# A tap of `run_model_tapped`: a decoder layer's index (the residual stream
# entering that layer) or FINAL_NORM (the final norm's output).
Tap = int | str


def run_model_tapped(
    model: nn.Module,
    params: dict[str, Any],
    constants: dict,
    kv_pages: list[tuple[jax.Array, ...]],
    input_ids: jax.Array,  # [T] int32
    positions: jax.Array,  # [T] int32
    md: AttentionMetadata,
    logits_indices: jax.Array,  # [S] int32
    taps: tuple[Tap, ...],
    inputs_embeds: jax.Array | None = None,  # [T, D]
    lora: tuple[dict, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array, list[tuple[jax.Array, ...]]]:
    """`run_model` that also returns the hidden states at ``taps`` for all
    T tokens, concatenated in order: (logits [S, V] float32, hidden [T,
    D * len(taps)], kv_pages). A layer's tap reads what the model sows
    under ``layer_input_<i>`` in its "intermediates" collection (llama.py);
    FINAL_NORM captures its top-level final norm."""
    from .llama import INTERMEDIATES, layer_input_name
    from .spec import ModelContractError

    def final_norm(module: nn.Module, method: str) -> bool:
        return method == "__call__" and tuple(module.path) == (FINAL_NORM,)

    variables = {"params": params, "constants": constants}
    if lora is not None:
        variables[COLLECTION] = lora_collection(*lora)
    capture = final_norm if FINAL_NORM in taps else False
    # inputs_embeds only when given: not every family's __call__ takes it.
    extra: dict[str, Any] = ({} if inputs_embeds is None
                             else {"inputs_embeds": inputs_embeds})
    (logits, kv_pages), state = model.apply(
        variables, input_ids, positions, kv_pages, md, logits_indices,
        capture_intermediates=capture, mutable=[INTERMEDIATES], **extra)
    sown = state.get(INTERMEDIATES, {})
    rows = []
    for tap in taps:
        name = ("__call__" if tap == FINAL_NORM
                else layer_input_name(int(tap)))
        got = (sown.get(FINAL_NORM, {}) if tap == FINAL_NORM else sown).get(name)
        if got is None:
            raise ModelContractError(
                f"{type(model).__name__} gives no hidden state at {tap!r} "
                "(no top-level final norm named FINAL_NORM, no sown layer "
                "inputs, or no such layer), so it cannot serve as a pooling "
                "model or an EAGLE head's target")
        rows.append(got[0])
    return logits, jnp.concatenate(rows, axis=-1), kv_pages
