"""Architectures by HF ``architectures`` name."""

from __future__ import annotations

from .llama import LlamaForCausalLM

# Every Llama-family variant is the same module; ModelConfig carries the
# differences (qkv bias, q/k norm, sliding window).
ARCHITECTURES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def model_class(architecture: str):
    return ARCHITECTURES[architecture]
