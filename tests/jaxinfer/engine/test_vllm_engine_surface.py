"""vLLM's engine-side surface on the tiny model: priority under fcfs is
refused, swap space exists only for swap preemption, RoPE-scaled contexts,
tokenizer-only folders, best_of, use_beam_search with length_penalty,
truncate_prompt_tokens."""

from __future__ import annotations

import os
import shutil

import pytest

from jaxinfer import SamplingParams
from jaxinfer.errors import InvalidRequestError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm()


def test_fcfs_engine_refuses_priority(llm, make_llm):
    sp = SamplingParams(max_tokens=2, temperature=0)
    with pytest.raises(InvalidRequestError, match="scheduling_policy='priority'"):
        llm.generate([[5, 6, 7]], sp, use_tqdm=False, priority=[1])
    assert not llm.llm_engine.has_unfinished_requests()
    prio = make_llm(scheduling_policy="priority")
    out = prio.generate([[5, 6, 7]], sp, use_tqdm=False, priority=[1])
    assert len(out[0].outputs[0].token_ids) == 2


def test_host_pool_only_under_swap(llm, make_llm):
    assert llm.llm_engine.runner.num_host_blocks == 0
    swap = make_llm(swap_space=0.001)
    assert swap.llm_engine.scheduler_config.preemption_mode == "swap"
    assert swap.llm_engine.runner.num_host_blocks > 0


def test_rope_scaled_context_beyond_max_position_embeddings(tiny_model_factory,
                                                            cache_dir):
    from jaxinfer import LLM
    path = tiny_model_factory(rope="linear")  # 512 positions x factor 2
    llm = LLM(path, dtype="float32", max_model_len=1024, max_num_seqs=2,
              max_num_batched_tokens=256, compilation_cache_dir=cache_dir)
    assert llm.llm_engine.max_model_len == 1024
    prompt = list(range(100, 700))  # longer than max_position_embeddings
    out = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_tokenizer_only_folder(tiny_path, make_llm, llm, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in os.listdir(tiny_path):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(os.path.join(tiny_path, name), folder)
    assert not (folder / "config.json").exists()
    other = make_llm(tokenizer=str(folder))
    text = "Hello tokenizer folders"
    assert other.get_tokenizer().encode(text) == llm.get_tokenizer().encode(text)


def test_best_of_returns_the_most_likely_of_its_samples(llm):
    prompt = [[11, 12, 13, 14]]
    all4 = llm.generate(prompt, SamplingParams(n=4, seed=7, max_tokens=4,
                                               logprobs=0), use_tqdm=False)[0]
    best = llm.generate(prompt, SamplingParams(n=2, best_of=4, seed=7,
                                               max_tokens=4), use_tqdm=False)[0]
    ranked = sorted(all4.outputs, key=lambda c: c.cumulative_logprob,
                    reverse=True)
    assert [c.token_ids for c in best.outputs] == [c.token_ids for c in ranked[:2]]
    assert [c.index for c in best.outputs] == [0, 1]
    assert all(c.logprobs is None for c in best.outputs)  # not asked for


def test_use_beam_search_through_generate_with_length_penalty(llm):
    from jaxinfer.sampling_params import BeamSearchParams
    prompt = [21, 22, 23]
    for penalty in (0.0, 2.0):
        got = llm.generate([prompt], SamplingParams(
            use_beam_search=True, n=2, temperature=0.0, max_tokens=4,
            length_penalty=penalty, ignore_eos=True), use_tqdm=False)[0]
        want = llm.beam_search([{"prompt_token_ids": prompt}], BeamSearchParams(
            beam_width=2, max_tokens=4, length_penalty=penalty,
            ignore_eos=True))[0]
        assert [c.token_ids for c in got.outputs] == \
            [b.tokens[len(prompt):] for b in want.sequences]
        assert got.outputs[0].cumulative_logprob == pytest.approx(
            want.sequences[0].cum_logprob)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    out = llm.generate([list(range(30, 40))], SamplingParams(
        max_tokens=1, temperature=0, truncate_prompt_tokens=3), use_tqdm=False)
    assert out[0].prompt_token_ids == [37, 38, 39]


def test_cpu_pool_honours_gpu_memory_utilization(llm, make_llm, monkeypatch):
    """On CPU the pool holds every seat at full length; a share of the
    available host memory (gpu_memory_utilization) caps it: more memory,
    proportionally more pages."""
    from jaxinfer.worker import kv_pool_size
    cfg = llm.llm_engine.scheduler_config
    per_seq = -(-cfg.max_model_len // llm.llm_engine.cache_config.block_size)
    full = cfg.max_num_seqs * per_seq + 1  # + the null page
    assert llm.llm_engine.runner.num_blocks == full
    page = llm.llm_engine.runner.page_bytes
    sizes = []
    for extra in (0, 10):
        available = 2 * (per_seq + 6 + extra) * page  # x 0.5 below
        monkeypatch.setattr(kv_pool_size, "host_available_bytes",
                            lambda available=available: available)
        sizes.append(make_llm(gpu_memory_utilization=0.5,
                              num_gpu_blocks_override=None).llm_engine.runner.num_blocks)
    assert sizes[0] < full  # the share of memory, not the seats, decided
    assert sizes[1] - sizes[0] == 10
