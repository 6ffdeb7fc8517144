"""Mixtral (``MixtralForCausalLM``): Mistral's decoder with a mixture of
experts in every layer (``moe.py``): softmax over the router's logits, the
top k, renormalised to sum to one."""

from __future__ import annotations

import functools
from typing import Any

from .llama import GGUF_TOP_NAMES, decoder_weights
from .moe import ExpertNames, MoEConfig, MoEForCausalLM, moe_config_from_hf
from .spec import GGUFNames, ModelSpec

# HF's Mixtral checkpoints: w1 is the gate, w3 the up, w2 the down
# projection of each expert.
MIXTRAL_EXPERTS = ExpertNames(router="gate", gate="experts.{e}.w1",
                              up="experts.{e}.w3", down="experts.{e}.w2")


# llama.cpp writes Mixtral as a "llama" file with an expert count: Llama's
# attention names (q/k rows permuted) and each layer's experts stacked
# [E, out, in] under one name.
GGUF_MIXTRAL_LAYER_NAMES = MIXTRAL_EXPERTS.gguf_layer_names("block_sparse_moe")


def mixtral_config_from_hf(hf: dict[str, Any]) -> MoEConfig:
    # A field the config leaves out takes MixtralConfig's default, as HF.
    return moe_config_from_hf(hf, "MixtralForCausalLM", dict(
        num_experts=int(hf.get("num_local_experts", 8)),
        num_experts_per_tok=int(hf.get("num_experts_per_tok", 2)),
        moe_intermediate_size=int(hf["intermediate_size"]),
        norm_topk_prob=True))


SPECS = (
    ModelSpec(architecture="MixtralForCausalLM", model=MoEForCausalLM,
              config_from_hf=mixtral_config_from_hf,
              weights=functools.partial(decoder_weights,
                                        mlp_cls=MIXTRAL_EXPERTS,
                                        mlp_hf="block_sparse_moe"),
              gguf=GGUFNames("llama", GGUF_MIXTRAL_LAYER_NAMES,
                             GGUF_TOP_NAMES, permuted_qk=True,
                             experts=True),
              fuses_qkv=True),
)
