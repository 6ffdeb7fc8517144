"""LoRA fixtures: the tiny Llama, three PEFT adapters of it, one engine
with LoRA on (shared by the modules of this folder)."""

from __future__ import annotations

import pytest

from tests.lora_adapters import make_adapters

# Chunked prefill (32-token steps over 16-token pages), prefix caching on,
# two device slots and two host slots for three adapters.
ENGINE = dict(dtype="float32", max_model_len=256, max_num_seqs=8,
              max_num_batched_tokens=32, block_size=16,
              num_gpu_blocks_override=128, enable_prefix_caching=True,
              enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=2)


@pytest.fixture(scope="session")
def base_path(tiny_model_factory):
    return tiny_model_factory()


@pytest.fixture(scope="session")
def adapters(base_path, tmp_path_factory):
    return make_adapters(base_path, str(tmp_path_factory.mktemp("adapters")))


@pytest.fixture(scope="session")
def lora_cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache-lora"))


@pytest.fixture(scope="session")
def lora_llm(base_path, lora_cache_dir):
    from jaxinfer import LLM
    return LLM(base_path, compilation_cache_dir=lora_cache_dir, **ENGINE)
