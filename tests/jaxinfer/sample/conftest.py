"""One tiny float32 engine shared by this folder's engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama):
    from jaxinfer import LLM
    return LLM(tiny_llama, dtype="float32", max_model_len=256,
               num_gpu_blocks_override=512, max_num_seqs=40,
               max_num_batched_tokens=512, block_size=16)


@pytest.fixture(scope="session")
def hf_tiny(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(
        tiny_llama, dtype=torch.float32, local_files_only=True).eval()
