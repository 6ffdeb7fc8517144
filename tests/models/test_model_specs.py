"""Every registered architecture's spec against its own module: the weight
list fills exactly the module's params with the declared shapes, the GGUF
name tables reach every tensor, and the parameter count is the checkpoint's.
Shapes only (``jax.eval_shape``): no weights are made."""

from __future__ import annotations

import dataclasses
import math

import pytest
from flax import linen as nn

from jaxinfer.models import model_spec, supported_architectures
from jaxinfer.models.abstract import abstract_variables
from jaxinfer.models.gguf_loader import _hf_name
from jaxinfer.models.spec import verify_weights
from jaxinfer.models.weights import checkpoint_names

TINY_HF = dict(vocab_size=96, hidden_size=32, intermediate_size=48,
               num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)


def _configs(architecture):
    """Untied and tied; each also with one q/k/v weight where the family's
    weight list lays one out (models/fused_qkv.py)."""
    spec = model_spec(architecture)
    for tied in (False, True):
        cfg = spec.config_from_hf(dict(
            TINY_HF, architectures=[architecture], tie_word_embeddings=tied))
        yield spec, cfg
        if spec.fuses_qkv:
            yield spec, dataclasses.replace(cfg, fused_qkv=True)


@pytest.mark.parametrize("architecture", supported_architectures())
def test_weights_fill_the_module(architecture):
    for spec, cfg in _configs(architecture):
        abstract = nn.unbox(abstract_variables(spec.model(cfg), cfg)["params"])
        verify_weights(spec, cfg, abstract)
        # Each checkpoint tensor once (a fused one may feed several params).
        shapes = {w.hf_name: w.hf_shape for w in spec.weights(cfg)}
        assert cfg.num_params == sum(math.prod(s) for s in shapes.values())


@pytest.mark.parametrize("architecture", [
    a for a in supported_architectures() if model_spec(a).gguf is not None])
def test_gguf_names_reach_every_tensor(architecture):
    for spec, cfg in _configs(architecture):
        names = spec.gguf
        assert names is not None
        gguf = [f"blk.{i}.{g}.{kind}" for i in range(cfg.num_layers)
                for g in names.layer_names for kind in ("weight", "bias")]
        reachable = {_hf_name(names, g) for g in [*gguf, *names.top_names]}
        missing = [n for w in spec.weights(cfg) for n in checkpoint_names(w)
                   if n not in reachable]
        assert not missing


def test_fused_qkv_is_laid_out_by_the_llama_module_families():
    fused = {a for a in supported_architectures() if model_spec(a).fuses_qkv}
    assert fused == {"LlamaForCausalLM", "MistralForCausalLM",
                     "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                     "MixtralForCausalLM", "Qwen3MoeForCausalLM",
                     "Phi3ForCausalLM"}


def test_family_choices_come_from_the_spec():
    """HF's Qwen2 always has q/k/v biases, Qwen3 always q/k norm; neither
    writes a config field for it."""
    hf = dict(TINY_HF)
    qwen2 = model_spec("Qwen2ForCausalLM").config_from_hf(hf)
    qwen3 = model_spec("Qwen3ForCausalLM").config_from_hf(hf)
    llama = model_spec("LlamaForCausalLM").config_from_hf(hf)
    assert (qwen2.attention_bias, qwen2.qk_norm) == (True, False)
    assert (qwen3.attention_bias, qwen3.qk_norm) == (False, True)
    assert (llama.attention_bias, llama.qk_norm) == (False, False)
    assert qwen2.architecture == "Qwen2ForCausalLM"
