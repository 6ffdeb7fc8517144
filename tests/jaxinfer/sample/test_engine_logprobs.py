"""Logprobs through the engine agree with HF's log_softmax (float32)."""

from __future__ import annotations

import numpy as np
import torch

from jaxinfer import SamplingParams
from jaxinfer.logprobs import Logprob

TOL = 1e-4


def _hf_logprobs(hf, ids):
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).numpy()


def _check_entry(entry, lp_row, chosen, k):
    assert chosen in entry
    assert all(isinstance(v, Logprob) for v in entry.values())
    assert len(entry) in (k, k + 1)
    for tid, v in entry.items():
        assert abs(v.logprob - lp_row[tid]) < TOL, (tid, v.logprob, lp_row[tid])
    # The chosen token's rank counts the tokens at least as likely.
    # (within one place: a near-tie may round either way).
    assert abs(entry[chosen].rank - int(np.sum(lp_row >= lp_row[chosen]))) <= 1
    top = sorted((v.logprob for t, v in entry.items() if v.rank <= k),
                 reverse=True)[:k]
    np.testing.assert_allclose(top, np.sort(lp_row)[::-1][:k], atol=TOL)


def test_sample_and_prompt_logprobs_match_hf(tiny_llm, hf_tiny):
    prompts = [[1, 400, 401, 402, 77, 5000], [1, 9, 8, 7, 6, 5, 4, 3, 300, 301,
                                              302, 303, 304, 305, 306, 307, 308, 42]]
    for temperature in (0.0, 0.9):
        sp = SamplingParams(max_tokens=6, temperature=temperature, seed=7,
                            logprobs=5, prompt_logprobs=3, ignore_eos=True)
        outs = tiny_llm.generate([{"prompt_token_ids": p} for p in prompts], sp,
                                 use_tqdm=False)
        for prompt, out in zip(prompts, outs):
            comp = out.outputs[0]
            ids = prompt + comp.token_ids
            lp = _hf_logprobs(hf_tiny, ids)
            assert len(comp.logprobs) == len(comp.token_ids) == 6
            total = 0.0
            for j, tok in enumerate(comp.token_ids):
                row = lp[len(prompt) - 1 + j]
                _check_entry(comp.logprobs[j], row, tok, 5)
                total += row[tok]
                if temperature == 0.0:
                    assert comp.logprobs[j][tok].rank == 1
            assert abs(comp.cumulative_logprob - total) < 1e-3
            assert out.prompt_logprobs[0] is None
            assert len(out.prompt_logprobs) == len(prompt)
            for i in range(1, len(prompt)):
                _check_entry(out.prompt_logprobs[i], lp[i - 1], prompt[i], 3)


def test_no_logprobs_unless_asked(tiny_llm):
    out = tiny_llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2),
                            use_tqdm=False)[0]
    assert out.outputs[0].logprobs is None
    assert out.outputs[0].cumulative_logprob is None
    assert out.prompt_logprobs is None


def test_logprobs_zero_gives_only_the_sampled_token(tiny_llm):
    out = tiny_llm.generate([[1, 2, 3]], SamplingParams(
        max_tokens=3, logprobs=0, temperature=0.0), use_tqdm=False)[0].outputs[0]
    assert [list(d) for d in out.logprobs] == [[t] for t in out.token_ids]


def test_prompt_logprobs_in_chunks_of_the_rows_one_step_scores(
        tiny_llama, hf_tiny, monkeypatch, tmp_path):
    """A step scores at most SchedulerConfig.max_prompt_logprob_rows prompt
    tokens (the pool reserves room for their logits): a longer prompt that
    asks for prompt logprobs is prefilled in chunks of that many, and its
    logprobs are still HF's; a request beside it keeps the whole budget."""
    import jaxinfer.config
    from jaxinfer import LLM
    monkeypatch.setattr(jaxinfer.config, "PROMPT_LOGPROB_MAX_ROWS", 8)
    timeline = tmp_path / "steps.jsonl"
    llm = LLM(tiny_llama, dtype="float32", max_model_len=256,
              num_gpu_blocks_override=128, max_num_seqs=4,
              max_num_batched_tokens=64, block_size=16,
              profile_steps=str(timeline))
    scored = [1] + list(range(600, 628))  # 29 tokens: 28 scored
    plain = [1] + list(range(700, 740))  # 41 tokens, no prompt logprobs
    outs = llm.generate(
        [{"prompt_token_ids": scored}, {"prompt_token_ids": plain}],
        [SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2),
         SamplingParams(max_tokens=2, temperature=0.0)], use_tqdm=False)
    lp = _hf_logprobs(hf_tiny, scored)
    assert len(outs[0].prompt_logprobs) == len(scored)
    for i in range(1, len(scored)):
        _check_entry(outs[0].prompt_logprobs[i], lp[i - 1], scored[i], 2)
    prefill = [r.prefill_tokens for r in llm.llm_engine.timeline.records
               if r.prefill_tokens]
    # The first step takes the plain prompt whole beside 8 scored tokens;
    # the scored prompt's remaining 21 follow 8 at a time.
    assert prefill[0] == 8 + len(plain)
    assert prefill[1:] == [8, 8, 5]
