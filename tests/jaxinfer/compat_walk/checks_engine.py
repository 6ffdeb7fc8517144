"""Behaviour checks of the EngineArgs rows (vLLM's and jaxinfer's own),
through ``LLM(...)`` on the tiny model: each builds the engine the argument
changes (``make_llm``, BASE of conftest.py plus the argument) and looks at
what the argument governs -- tokens, pages, steps, batch sizes, files."""

from __future__ import annotations

import json
import os

import jax
import pytest

from jaxinfer import SamplingParams
from jaxinfer.errors import InvalidRequestError

from .registry import row_check

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
IDS = [{"prompt_token_ids": list(range(100, 120))}]


def tokens(llm, prompts=IDS, params=GREEDY):
    return [o.outputs[0].token_ids for o in
            llm.generate(prompts, params, use_tqdm=False)]


def run_steps(engine, prompts, params=GREEDY, priorities=None):
    """Adds every prompt, then steps to the end; returns per step
    (running requests, tokens scheduled) and the finish order."""
    ids = [engine.add_request(None, p, params,
                              priority=priorities[i] if priorities else 0)
           for i, p in enumerate(prompts)]
    steps, finished = [], []
    while engine.has_unfinished_requests():
        outs = engine.step()
        steps.append((engine.scheduler.num_running, engine.last_step_tokens))
        finished += [o.request_id for o in outs if o.finished]
    return steps, [ids.index(r) for r in finished]


def long_prompts(n, length):
    return [{"prompt_token_ids": [300 + i] * length} for i in range(n)]


@row_check("engine_args", "model")
def the_model_is_the_checkpoint_given(llm, walk_model):
    from tests.jaxinfer.engine.conftest import hf_greedy
    ids = IDS[0]["prompt_token_ids"]
    assert tokens(llm, params=SamplingParams(temperature=0, max_tokens=6)) == \
        hf_greedy(walk_model, [ids], 6)


@row_check("engine_args", "load_format")
def dummy_weights_are_not_the_checkpoints(llm, make_llm):
    assert tokens(make_llm(load_format="dummy")) != tokens(llm)


@row_check("engine_args", "dtype")
def dtype_sets_the_weights_dtype(llm, make_llm):
    def dtypes(m):
        return {str(x.dtype) for x in jax.tree_util.tree_leaves(
            m.llm_engine.runner.params)}
    assert dtypes(llm) == {"float32"}
    assert dtypes(make_llm(dtype="bfloat16")) == {"bfloat16"}


@row_check("engine_args", "tokenizer")
def a_tokenizer_only_folder_is_used(llm, walk_model, tmp_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(walk_model)
    tok.chat_template = "TEMPLATE{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(tmp_path)  # tokenizer files only, no config.json
    from jaxinfer import LLM

    from .conftest import BASE
    other = LLM(walk_model, tokenizer=str(tmp_path), **BASE)
    out = other.chat([{"role": "user", "content": "hi"}],
                     SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.prompt_token_ids == tok.encode("TEMPLATEhi",
                                              add_special_tokens=False)


@row_check("engine_args", "seed")
def the_engine_seed_drives_unseeded_sampling(make_llm):
    hot = SamplingParams(temperature=5.0, max_tokens=6, ignore_eos=True)
    a, b, c = (tokens(make_llm(seed=s), params=hot) for s in (0, 0, 1))
    assert a == b and a != c


@row_check("engine_args", "max_model_len")
def max_model_len_bounds_prompt_and_output(llm, make_llm):
    out = llm.generate([{"prompt_token_ids": [5] * 120}],
                       SamplingParams(max_tokens=None, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 128 - 120
    short = make_llm(max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        short.generate([{"prompt_token_ids": [5] * 70}], GREEDY, use_tqdm=False)
    assert tokens(llm, [{"prompt_token_ids": [5] * 70}])  # 128 takes it


@row_check("engine_args", "tensor_parallel_size")
def two_way_tensor_parallel_matches_one_device(walk_model):
    # A second process: the host's CPU must be split into 2 devices
    # before JAX starts (tests/sharding holds the same script).
    import subprocess
    import sys

    from tests.sharding.test_tensor_parallel import _SCRIPT
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, walk_model,
                           "reference"], capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    assert res["2"]["devices"] == 2 and res["1"]["devices"] == 1
    assert res["2"]["tokens"] == res["1"]["tokens"]


def pages_held_after_prefill(llm, n_tokens):
    engine = llm.llm_engine
    pool = engine.scheduler.kv.pool
    free = pool.num_free
    engine.add_request("pages", {"prompt_token_ids": list(range(7, 7 + n_tokens))},
                       SamplingParams(max_tokens=2, ignore_eos=True))
    engine.step()
    held = free - pool.num_free
    while engine.has_unfinished_requests():
        engine.step()
    return held


@row_check("engine_args", "block_size")
def block_size_is_the_page_size(make_llm):
    assert pages_held_after_prefill(make_llm(enable_prefix_caching=False), 40) == 3
    assert pages_held_after_prefill(make_llm(block_size=8,
                                             enable_prefix_caching=False), 40) == 5


@row_check("engine_args", "num_gpu_blocks_override")
def the_pool_has_the_pages_asked_for(llm, make_llm):
    assert llm.llm_engine.runner.num_blocks == 64
    other = make_llm(num_gpu_blocks_override=20)
    assert other.llm_engine.runner.num_blocks == 20
    assert other.llm_engine.scheduler.kv.pool.num_blocks == 20


@row_check("engine_args", "gpu_memory_utilization")
def cpu_pool_is_the_share_of_host_memory(make_llm, monkeypatch):
    # On CPU the share is of the host memory available; pinned here so the
    # page count is exact: 1 GiB x share / page bytes.
    from jaxinfer.worker import kv_pool_size
    monkeypatch.setattr(kv_pool_size, "host_available_bytes", lambda: 1 << 30)
    sizes = []
    for share in (1.5e-4, 2.5e-4):  # both below the 4 seats x 8 pages cap
        runner = make_llm(num_gpu_blocks_override=None,
                          gpu_memory_utilization=share).llm_engine.runner
        # pages the budget holds, less the null page, plus the null page
        assert runner.num_blocks == int(share * (1 << 30) // runner.page_bytes)
        sizes.append(runner.num_blocks)
    assert sizes[1] > sizes[0]


@row_check("engine_args", "enable_prefix_caching")
def prefix_caching_reuses_pages(llm, make_llm):
    prompt = [{"prompt_token_ids": list(range(400, 440))}]
    for m, hits in ((llm, True), (make_llm(enable_prefix_caching=False), False)):
        tokens(m, prompt)
        out = m.generate(prompt, GREEDY, use_tqdm=False)[0]
        assert (out.num_cached_tokens >= 32) is hits


@row_check("engine_args", "swap_space")
@row_check("engine_args_jaxinfer", "preemption_mode")
def preemption_swaps_or_recomputes(llm, make_llm):
    # 4 requests growing to 4 pages each in a pool of 11 usable pages.
    prompts = long_prompts(4, 40)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    want = tokens(llm, prompts, params)
    for kw, swapped in (({"swap_space": 1}, True),
                        ({"preemption_mode": "recompute"}, False)):
        m = make_llm(num_gpu_blocks_override=12, enable_prefix_caching=False, **kw)
        assert tokens(m, prompts, params) == want
        stats = m.llm_engine.get_stats()
        assert stats.num_preemptions > 0
        assert (stats.num_swap_outs > 0) is swapped


@row_check("engine_args", "max_num_batched_tokens")
def steps_hold_at_most_the_token_budget(make_llm):
    steps, _ = run_steps(make_llm(max_num_batched_tokens=16).llm_engine,
                         long_prompts(2, 60))
    assert max(t for _, t in steps) == 16


@row_check("engine_args", "max_num_seqs")
def the_running_batch_is_capped(make_llm):
    steps, _ = run_steps(make_llm(max_num_seqs=3).llm_engine, long_prompts(6, 5))
    assert max(r for r, _ in steps) == 3


@row_check("engine_args", "enable_chunked_prefill")
def chunked_prefill_splits_prompts(make_llm):
    budget = dict(max_num_batched_tokens=128)
    on, _ = run_steps(make_llm(**budget).llm_engine, long_prompts(2, 100))
    off, _ = run_steps(make_llm(enable_chunked_prefill=False, **budget).llm_engine,
                       long_prompts(2, 100))
    assert on[0][1] == 128  # the second prompt's first chunk fills the step
    assert off[0][1] == 100  # it waits until it fits whole


@row_check("engine_args", "scheduling_policy")
def priority_scheduling_runs_lower_values_first(make_llm):
    one = dict(max_num_seqs=1)
    _, order = run_steps(make_llm(scheduling_policy="priority", **one).llm_engine,
                         long_prompts(3, 5), priorities=[5, 0, -3])
    assert order == [2, 1, 0]
    fcfs = make_llm(**one).llm_engine
    _, order = run_steps(fcfs, long_prompts(3, 5))
    assert order == [0, 1, 2]
    with pytest.raises(InvalidRequestError, match="priority"):
        fcfs.add_request(None, IDS[0], GREEDY, priority=1)


@row_check("engine_args", "max_logprobs")
def max_logprobs_bounds_requests(llm, make_llm):
    with pytest.raises(ValueError, match="max_logprobs"):
        tokens(llm, params=SamplingParams(logprobs=21))
    small = make_llm(max_logprobs=2)
    assert tokens(small, params=SamplingParams(logprobs=2, max_tokens=2))
    with pytest.raises(ValueError, match="max_logprobs"):
        tokens(small, params=SamplingParams(logprobs=3))


@row_check("engine_args", "async_scheduling")
def async_scheduling_overlaps_steps(llm, make_llm):
    def overlapped(m):
        engine, seen = m.llm_engine, False
        engine.add_request("overlap", IDS[0], GREEDY)
        while engine.has_unfinished_requests():
            engine.step()
            seen |= engine._inflight is not None  # a step still on the device
        return seen
    off = make_llm(async_scheduling=False)
    assert overlapped(llm) and not overlapped(off)
    assert tokens(off) == tokens(llm)


@row_check("engine_args", "speculative_config")
def ngram_speculation_verifies_drafts(llm, make_llm):
    """Drafts from a repetitive prompt are verified (counted), and greedy
    tokens stay those of the engine without speculation."""
    spec = make_llm(speculative_config={"method": "ngram",
                                        "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 1})
    prompt = [{"prompt_token_ids": list(range(100, 110)) * 3}]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert tokens(spec, prompt, params) == tokens(llm, prompt, params)
    assert spec.llm_engine.get_stats().spec_decode.num_draft_tokens > 0


@row_check("engine_args_jaxinfer", "num_scheduler_steps")
def multi_step_decodes_windows_of_k(llm, make_llm):
    """Decodes go k to a program (fewer engine steps), same tokens."""
    windowed = make_llm(num_scheduler_steps=3)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    steps = {}
    for name, m in (("one", llm), ("three", windowed)):
        before = m.llm_engine.num_steps
        steps[name] = (tokens(m, params=params), m.llm_engine.num_steps - before)
    assert steps["three"][0] == steps["one"][0]
    assert steps["three"][1] < steps["one"][1] - 4, steps


@row_check("engine_args_jaxinfer", "attention_backend")
def the_kernel_backend_gives_the_same_tokens(llm, make_llm):
    kernel = make_llm(attention_backend="pallas_interpret")
    assert kernel.llm_engine.runner.backend == "pallas_interpret"
    assert llm.llm_engine.runner.backend == "reference"
    short = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    assert tokens(kernel, params=short) == tokens(llm, params=short)


@row_check("engine_args_jaxinfer", "compilation_cache_dir")
def compiled_programs_are_cached_on_disk(llm, make_llm):
    tokens(llm)
    used = llm.llm_engine.compilation_cache_dir
    assert used and os.listdir(used)  # JAX keeps one per process
    assert make_llm(compilation_cache_dir="").llm_engine.compilation_cache_dir is None


@row_check("engine_args_jaxinfer", "usage_context")
def usage_context_picks_the_large_gpu_token_budget(monkeypatch):
    from jaxinfer import config
    from jaxinfer.config import EngineArgs
    monkeypatch.setattr(config, "gpu_memory_bytes", lambda: 141 * 2**30)
    budgets = {c: EngineArgs(usage_context=c).scheduler_config(
        4096, on_cpu=False).max_num_batched_tokens for c in ("llm", "server")}
    assert budgets == {"llm": 16384, "server": 8192}


@row_check("engine_args_jaxinfer", "warmup")
def warmup_compiles_before_the_first_request(make_llm):
    from jaxinfer.engine.step_timeline import CompileClock
    CompileClock.install()
    warm = make_llm(warmup=True, max_num_seqs=2, max_num_batched_tokens=16,
                    max_model_len=32, num_gpu_blocks_override=8)
    assert warm.llm_engine.warmup_programs > 0
    before = CompileClock.read()[1]
    tokens(warm, [{"prompt_token_ids": [9] * 5}],
           SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert CompileClock.read()[1] == before  # nothing left to compile


@row_check("engine_args_jaxinfer", "profile_steps")
def profile_steps_writes_one_line_per_step(make_llm, tmp_path):
    path = tmp_path / "steps.jsonl"
    m = make_llm(profile_steps=str(path))
    tokens(m)
    m.llm_engine.timeline.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == m.llm_engine.num_steps > 1
