"""Bad prompts and engine arguments raise typed errors naming
the values; a rejected request leaves the others in flight untouched."""

from __future__ import annotations

import pytest

from jaxinfer import SamplingParams
from jaxinfer.config import EngineArgs
from jaxinfer.errors import InvalidConfigError, InvalidRequestError

from .conftest import random_prompts


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm()


def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(InvalidRequestError, match=r"200 tokens.*max_model_len is 128"):
        llm.generate({"prompt_token_ids": [5] * 200}, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="128 tokens"):
        llm.generate({"prompt_token_ids": [5] * 128}, use_tqdm=False)


@pytest.mark.parametrize("prompt", ["", [], {"prompt_token_ids": []}])
def test_empty_prompt(llm, prompt):
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate(prompt if prompt != [] else [prompt], use_tqdm=False)


def test_token_ids_outside_vocab(llm):
    with pytest.raises(InvalidRequestError, match=r"\[49152\].*vocabulary"):
        llm.generate({"prompt_token_ids": [1, 49152]}, use_tqdm=False)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(block_size=7), r"block_size must be one of .* got 7"),
    (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization .* got 1.5"),
    (dict(swap_space=-1), r"swap_space .* got -1"),
    (dict(max_num_seqs=0), r"max_num_seqs .* got 0"),
    (dict(max_num_seqs=64, max_num_batched_tokens=32),
     r"max_num_batched_tokens must be >= max_num_seqs \(64\), got 32"),
    (dict(enable_chunked_prefill=False, max_num_batched_tokens=64),
     r"max_num_batched_tokens must be >= max_model_len \(128\).*got 64"),
    (dict(max_model_len=100000), r"max_model_len \(100000\) is larger"),
    (dict(num_gpu_blocks_override=4), r"holds 48 tokens.*max_model_len=128"),
    (dict(scheduling_policy="lifo"), r"policy must be .* got 'lifo'"),
    (dict(preemption_mode="drop"), r"preemption_mode .* got 'drop'"),
])
def test_invalid_engine_args(make_llm, kwargs, pattern):
    with pytest.raises(InvalidConfigError, match=pattern):
        make_llm(**kwargs)


def test_engine_args_are_validated_on_construction():
    with pytest.raises(InvalidConfigError, match="max_model_len .* got -3"):
        EngineArgs(max_model_len=-3)
    with pytest.raises(InvalidConfigError,
                       match="tensor_parallel_size must be a positive .* got 0"):
        EngineArgs(tensor_parallel_size=0)
    assert issubclass(InvalidConfigError, ValueError)


def test_rejected_request_does_not_disturb_others(llm):
    engine = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=8)
    prompts = random_prompts(3, seed=9)
    alone = [llm.generate({"prompt_token_ids": p}, sp, use_tqdm=False)[0]
             .outputs[0].token_ids for p in prompts]
    ids = [engine.add_request(None, {"prompt_token_ids": p}, sp) for p in prompts]
    done = {}
    for step in range(200):
        if step == 2:
            with pytest.raises(InvalidRequestError):
                engine.add_request(None, {"prompt_token_ids": [7] * 500}, sp)
            with pytest.raises(InvalidRequestError):
                engine.add_request(None, "", sp)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        if not engine.has_unfinished_requests():
            break
    assert [done[i] for i in ids] == alone
    assert engine.scheduler.kv.pool.num_free == engine.scheduler.kv.pool.num_blocks - 1
