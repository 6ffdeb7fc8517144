"""The step timeline records what each step really ran, and warm-up builds
exactly the programs the buckets list (and steps use them)."""

from __future__ import annotations

import json

import pytest

from jaxinfer import SamplingParams
from jaxinfer.worker.sampler_widths import bias_widths

from .conftest import random_prompts
from .test_multi_step import _windows

pytestmark = pytest.mark.slow


def test_timeline_fields_match_the_steps(make_llm, tmp_path):
    path = tmp_path / "steps.jsonl"
    llm = make_llm(profile_steps=str(path))
    engine = llm.llm_engine
    dispatched = []
    dispatch = engine.runner.dispatch

    def spy(out, *rest):
        step = dispatch(out, *rest)
        if out.scheduled:  # (an idle step only reports finished requests)
            dispatched.append((step.dims, [(len(s.token_ids), s.start_pos)
                                           for s in out.scheduled]))
        return step
    engine.runner.dispatch = spy
    prompts = random_prompts(12, seed=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=6, temperature=0.0,
                                       ignore_eos=True), use_tqdm=False)
    engine.timeline.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == len(dispatched)
    for r, (dims, rows) in zip(records, dispatched):
        assert (r["T"], r["S"], r["P"], r["decode_only"]) == dims[:4]
        assert r["num_seqs"] == len(rows)
        assert r["decode_tokens"] == sum(1 for q, _ in rows if q == 1)
        assert r["prefill_tokens"] == sum(q for q, _ in rows if q > 1)
        assert r["kv_tokens"] == sum(q + start for q, start in rows)
        assert r["device_ms"] >= 0 and r["host_ms"] >= 0
        assert r["pages_in_use"] > 0
    # Every prompt token not found in the prefix cache and every output
    # token but the last of each request went through a step (the last is
    # sampled, never fed back).
    fed = sum(r["decode_tokens"] + r["prefill_tokens"] for r in records)
    hits = engine.get_stats().prefix_cache_hits
    assert fed == sum(map(len, prompts)) - hits + sum(
        len(o.outputs[0].token_ids) - 1 for o in outs)
    # The first step compiled (or loaded) its program; later steps of a
    # shape already built did not.
    assert records[0]["compiles"] >= 1 and records[0]["compile_ms"] > 0
    seen = set()
    for r in records:
        shape = (r["T"], r["S"], r["P"], r["decode_only"])
        if shape in seen:
            assert r["compiles"] == 0
        seen.add(shape)


def test_a_window_is_one_record_of_its_steps(make_llm, tmp_path):
    """With multi-step decode a window is one record with its num_steps;
    the report's roofline counts each of its steps."""
    from benchmarks.timeline_report import step_t_min
    path = tmp_path / "steps.jsonl"
    llm = make_llm(profile_steps=str(path), num_scheduler_steps=4)
    engine = llm.llm_engine
    sent = _windows(engine)
    outs = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(
        max_tokens=13, temperature=0.0, ignore_eos=True), use_tqdm=False)
    engine.timeline.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["num_steps"] for r in records] == sent
    assert 4 in sent
    fed = sum((r["decode_tokens"] + r["prefill_tokens"]) * r["num_steps"]
              for r in records)
    assert fed == 3 + len(outs[0].outputs[0].token_ids) - 1
    window = next(r for r in records if r["num_steps"] == 4)
    roof = {"bw": 1e12, "flops": 1e14}
    singles = [dict(window, num_steps=1, kv_tokens=window["kv_tokens"] + i,
                    attn_pairs=window["attn_pairs"] + i) for i in range(4)]
    assert step_t_min(window, roof) == pytest.approx(
        sum(step_t_min(r, roof) for r in singles))
    assert step_t_min(window, roof) > 3.9 * step_t_min(singles[0], roof)


def test_warmup_builds_exactly_the_listed_buckets(make_llm):
    llm = make_llm(warmup=True, max_num_seqs=4)
    programs = llm.llm_engine.runner.programs
    shapes = programs.buckets.all_shapes()
    built = [key[1] for key in programs.built if key[0] == "forward"]
    # A forward program per shape, and each prefill shape's variant with
    # prompt-logprob rows.
    prefill = [shape for shape in shapes if not shape.decode_only]
    assert sorted(built) == sorted(shapes + prefill)
    # Three plain sampler variants (greedy, sampled, filtered) and one full
    # tier per bias width, per S of a shape.
    samplers = [key for key in programs.built if key[0] == "sample"]
    widths = len(bias_widths(programs.cfg.vocab_size))
    assert len(samplers) == (3 + widths) * len({shape[1] for shape in shapes})
    aux = [key for key in programs.built
           if key[0] in ("prompt_logprobs", "count")]
    assert len(programs.built) == len(built) + len(samplers) + len(aux)
    used = []
    run = programs.run

    def spy(state, inputs, penalty_state=None):
        fwd = programs.forward_args(state, inputs.packed,
                                    inputs.logits_indices, inputs.encoder,
                                    inputs.lora_pool)
        smp = programs.sample_args(
            programs.logits_struct(inputs.bucket.seqs), penalty_state,
            state.prev_tokens, inputs.sampling)
        used.append(
            programs.forward_key(inputs.bucket, fwd) in programs.built and
            programs.sample_key(inputs.num_logprobs, smp) in programs.built)
        return run(state, inputs, penalty_state)
    programs.run = spy
    llm.generate([{"prompt_token_ids": p} for p in random_prompts(6, seed=2)],
                 [SamplingParams(max_tokens=5, temperature=t, top_p=p)
                  for t, p in [(0.0, 1.0), (1.0, 1.0), (1.0, 0.8)] * 2],
                 use_tqdm=False)
    assert used and all(used)
