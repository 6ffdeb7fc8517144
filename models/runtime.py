"""The one call from the engine into a model.

A model owns the host-built tables it reads (RoPE cos/sin rows today; two
tables for a model with two RoPE bases): ``model_constants`` builds them
once per engine, and ``run_model`` hands them to the model beside its
params. ``inputs_embeds`` lets an encoder's outputs stand in for token
embeddings (``embed_tokens`` gives the embeddings to merge them into);
``lora`` adds each token's LoRA adapter (``lora.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .attention import AttentionMetadata
from .lora import COLLECTION, lora_collection


def model_constants(model, max_model_len: int) -> dict:
    """Device arrays of the model's constants for positions below
    ``max_model_len``; built once, passed to every ``run_model``."""
    return jax.tree_util.tree_map(jnp.asarray, model.constants(max_model_len))


def run_model(
    model,
    params,
    constants: dict,  # model_constants(model, max_model_len)
    kv_pages,  # list of L (k_pages, v_pages)
    input_ids: jax.Array,  # [T] int32
    positions: jax.Array,  # [T] int32
    md: AttentionMetadata,
    logits_indices: jax.Array,  # [S] int32
    inputs_embeds: jax.Array | None = None,  # [T, D]
    lora: tuple[dict, jax.Array] | None = None,  # (adapter pool, [T] slot ids)
):
    """-> (logits [S, V] float32, updated kv_pages). ``lora``: the device
    pool of LoRA adapters (``lora.py``'s layout) and each token's slot."""
    variables = {"params": params, "constants": constants}
    if lora is not None:
        variables[COLLECTION] = lora_collection(*lora)
    return model.apply(variables, input_ids, positions, kv_pages, md,
                       logits_indices, inputs_embeds=inputs_embeds)


def embed_tokens(model, params, input_ids: jax.Array) -> jax.Array:
    """[T] int32 -> [T, D]: the embeddings ``run_model`` would look up."""
    return model.apply({"params": params}, input_ids, method="embed")
