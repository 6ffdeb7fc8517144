"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's decoder (q/k norms) with a
mixture of experts in every layer (``moe.py``): softmax over the router's
logits, the top k, renormalised only when ``norm_topk_prob`` says so.

HF's config can make some layers dense (``mlp_only_layers``, or a
``decoder_sparse_step`` above 1); no released Qwen3-MoE checkpoint does,
and such a config is refused, naming the field."""

from __future__ import annotations

import functools
from typing import Any

from .errors import ModelConfigError
from .llama import GGUF_TOP_NAMES, decoder_weights
from .moe import ExpertNames, MoEConfig, MoEForCausalLM, moe_config_from_hf
from .spec import GGUFNames, ModelSpec

QWEN3_MOE_EXPERTS = ExpertNames(router="gate", gate="experts.{e}.gate_proj",
                                up="experts.{e}.up_proj",
                                down="experts.{e}.down_proj")

# llama.cpp's names: the attention's as Qwen3's; each layer's experts
# stacked [E, out, in] under one name.
GGUF_MOE_LAYER_NAMES = QWEN3_MOE_EXPERTS.gguf_layer_names("mlp")


def qwen3_moe_config_from_hf(hf: dict[str, Any]) -> MoEConfig:
    layers = int(hf["num_hidden_layers"])
    step = int(hf.get("decoder_sparse_step", 1))
    dense = sorted({int(i) for i in hf.get("mlp_only_layers") or ()} | {
        i for i in range(layers) if step < 1 or (i + 1) % step})
    if dense:
        raise ModelConfigError(
            f"Qwen3MoeForCausalLM with dense layers {dense} (mlp_only_layers"
            f"={hf.get('mlp_only_layers')}, decoder_sparse_step={step}) is "
            "not supported: every layer must be a mixture of experts "
            "(mlp_only_layers=[], decoder_sparse_step=1)")
    # transformers 5 saves the expert count as num_local_experts; a field
    # the config leaves out takes Qwen3MoeConfig's default, as HF.
    experts = hf.get("num_experts", hf.get("num_local_experts", 128))
    return moe_config_from_hf(hf, "Qwen3MoeForCausalLM", dict(
        num_experts=int(experts),
        num_experts_per_tok=int(hf.get("num_experts_per_tok", 8)),
        moe_intermediate_size=int(hf.get("moe_intermediate_size", 768)),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False))),
        qk_norm=True)


SPECS = (
    ModelSpec(architecture="Qwen3MoeForCausalLM", model=MoEForCausalLM,
              config_from_hf=qwen3_moe_config_from_hf,
              weights=functools.partial(decoder_weights,
                                        mlp_cls=QWEN3_MOE_EXPERTS),
              gguf=GGUFNames("qwen3moe", GGUF_MOE_LAYER_NAMES,
                             GGUF_TOP_NAMES, permuted_qk=False,
                             config_defaults={"norm_topk_prob": True},
                             experts=True),
              fuses_qkv=True),
)
