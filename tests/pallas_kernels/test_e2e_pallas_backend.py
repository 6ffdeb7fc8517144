"""End to end: a tiny model gives the same greedy tokens through the Pallas
kernels (interpret mode on CPU, compiled on GPU) as through the reference."""

from __future__ import annotations

import jax
import pytest

BACKEND = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"
# A long prompt is prefilled in chunks of the 32-token budget (the kernel reads
# its prefix from the pages) while the short one decodes in the same steps.
PROMPTS = ["Hello there, how are you doing today? " * 4, "The capital of"]


def _greedy(path, backend):
    from jaxinfer import LLM, SamplingParams
    llm = LLM(path, attention_backend=backend, num_gpu_blocks_override=32,
              max_model_len=128, max_num_batched_tokens=32, max_num_seqs=4,
              block_size=16)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids)
            for o in llm.generate(PROMPTS, sp, use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama"])
def test_greedy_tokens_match_reference(tiny_model_factory, arch):
    path = tiny_model_factory(arch)
    ref = _greedy(path, "reference")
    got = _greedy(path, BACKEND)
    assert all(len(r) == 6 for r in ref)
    assert got == ref
