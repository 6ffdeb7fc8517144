"""End to end: a tiny model gives the same greedy tokens through the Pallas
kernels (interpret mode on CPU, compiled on GPU) as through the reference,
and with the q/k norm, RoPE and K/V write as one kernel (rope_write_kv) as
with those left to XLA."""

from __future__ import annotations

import jax
import pytest

BACKEND = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"
# A long prompt is prefilled in chunks of the 32-token budget (the kernel reads
# its prefix from the pages) while the short one decodes in the same steps.
PROMPTS = ["Hello there, how are you doing today? " * 4, "The capital of"]


def _greedy(path, backend, prompts=PROMPTS, max_tokens=6):
    from jaxinfer import LLM, SamplingParams
    llm = LLM(path, attention_backend=backend, num_gpu_blocks_override=32,
              max_model_len=128, max_num_batched_tokens=32, max_num_seqs=4,
              block_size=16)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids)
            for o in llm.generate(prompts, sp, use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama"])
def test_greedy_tokens_match_reference(tiny_model_factory, arch):
    path = tiny_model_factory(arch)
    ref = _greedy(path, "reference")
    got = _greedy(path, BACKEND)
    assert all(len(r) == 6 for r in ref)
    assert got == ref


@pytest.mark.slow
def test_rope_write_kernel_on_and_off_give_the_same_tokens(tiny_model_factory):
    """Qwen3 (q/k norms on; the llama case above runs the kernel without
    them): both prompts prefill in one step, and their first tokens read
    the K/V that step wrote. (One token: a decode program of each backend
    would double the test's time, and the case above decodes.)"""
    from jaxinfer.models.attention import XLA_ROPE
    path = tiny_model_factory("qwen3")
    prompts = ["The capital of France is", "Hello there, how are you doing?"]
    on = _greedy(path, BACKEND, prompts, max_tokens=1)
    off = _greedy(path, BACKEND + XLA_ROPE, prompts, max_tokens=1)
    assert on == off
