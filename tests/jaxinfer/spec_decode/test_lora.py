"""Speculation with LoRA adapters: every draft position runs under its
row's adapter, so tokens equal those of the engine without speculation,
with two adapters and the base model in one batch."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.lora.request import LoRARequest
from tests.lora_adapters import make_adapters

pytestmark = pytest.mark.slow

ENGINE = dict(dtype="float32", max_model_len=128, max_num_seqs=8,
              max_num_batched_tokens=32, block_size=16, enable_lora=True,
              max_loras=2, max_lora_rank=8)


def test_adapters_with_speculation_equal_without(tiny_path, tmp_path_factory,
                                                 cache_dir):
    adapters = make_adapters(tiny_path, str(tmp_path_factory.mktemp("adapters")))
    requests = [LoRARequest(name, i + 1, path)
                for i, (name, path) in enumerate(adapters.items())][:2]
    prompts = [{"prompt_token_ids": [5, 6, 7, 8] * 4}] * 3
    lora = [requests[0], requests[1], None]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    got = {}
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3,
                        "prompt_lookup_min": 1}):
        llm = LLM(tiny_path, compilation_cache_dir=cache_dir,
                  speculative_config=spec, **ENGINE)
        got[spec is None] = [o.outputs[0].token_ids for o in llm.generate(
            prompts, sp, lora_request=lora, use_tqdm=False)]
        if spec is not None:
            assert llm.llm_engine.get_stats().spec_decode.num_draft_tokens > 0
    assert got[False] == got[True]
    assert len({tuple(t) for t in got[True]}) == 3  # each row its own model
