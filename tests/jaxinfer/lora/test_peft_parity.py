"""Greedy outputs with LoRA adapters equal HF transformers +
PEFT token for token, for three adapters and the base model mixed in one
batch (more adapters than device slots and than host slots), with chunked
prefill and prefix caching on and prompts sharing prefixes across
adapters; pages cached under one adapter serve only that adapter; and
moving adapters in and out of the device slots compiles nothing."""

from __future__ import annotations

import random

import jax
import pytest

from jaxinfer import LoRARequest, SamplingParams
from tests.lora_adapters import hf_peft_runner
from tests.runners import check_outputs_equal

pytestmark = pytest.mark.slow

MAX_TOKENS = 16


def _prompts(n: int = 4, seed: int = 3) -> list[list[int]]:
    """Mixed lengths; the first three share 40 tokens (2.5 pages)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 49152) for _ in range(40)]
    return [(shared if i < 3 else []) +
            [rng.randrange(3, 49152) for _ in range(rng.randrange(2, 30))]
            for i in range(n)]


def _lora_requests(adapters) -> dict:
    return {name: LoRARequest(name, i + 1, path)
            for i, (name, path) in enumerate(adapters.items())}


def _generate(llm, cases, requests):
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate([{"prompt_token_ids": p} for _, p in cases], sp,
                        lora_request=[requests.get(name) for name, _ in cases],
                        use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]


def test_mixed_adapters_equal_hf_peft(lora_llm, adapters, base_path):
    prompts = _prompts()
    names = [None, *adapters]
    # Interleaved, so that every step mixes adapters (and the base model).
    cases = [(name, p) for p in prompts for name in names]
    requests = _lora_requests(adapters)
    engine = lora_llm.llm_engine
    ours = _generate(lora_llm, cases, requests)
    for name in names:
        hf = hf_peft_runner(base_path, None if name is None else adapters[name])
        want = hf.generate_greedy(prompts, MAX_TOKENS)
        got = [o for (n, _), o in zip(cases, ours) if n == name]
        check_outputs_equal(want, got, f"hf+peft[{name}]", f"jaxinfer[{name}]")
    base = [o[0] for (n, _), o in zip(cases, ours) if n is None]
    for name in adapters:  # every adapter changes what the model says
        got = [o[0] for (n, _), o in zip(cases, ours) if n == name]
        assert sum(g != b for g, b in zip(got, base)) >= len(prompts) - 1, name
    # Three adapters, two slots: some were evicted and copied in again.
    assert engine.runner.lora.num_slot_loads >= 3
    # Again, now from the prefix cache (each adapter's own pages).
    hits = engine.get_stats().prefix_cache_hits
    assert _generate(lora_llm, cases, requests) == ours
    assert engine.get_stats().prefix_cache_hits > hits


def test_prefix_pages_belong_to_one_adapter(lora_llm, adapters):
    prompt = {"prompt_token_ids": list(range(1000, 1048))}  # 3 full pages
    sp = SamplingParams(temperature=0.0, max_tokens=2)
    a, b = list(_lora_requests(adapters).values())[:2]

    def cached(lora):
        return lora_llm.generate([prompt], sp, lora_request=lora,
                                 use_tqdm=False)[0].num_cached_tokens
    assert cached(a) == 0
    assert cached(a) == 32  # its own pages (the last token is recomputed)
    assert cached(b) == 0  # not adapter a's pages
    assert cached(None) == 0  # nor the base model
    assert cached(b) == 32 and cached(None) == 32


def test_samples_beams_and_chat_run_their_adapter(lora_llm, adapters):
    """n > 1 samples, beam search and chat carry the request's adapter."""
    from jaxinfer import BeamSearchParams
    lora = _lora_requests(adapters)["all-r8"]
    prompt = {"prompt_token_ids": [21, 22, 23, 24, 25, 26]}
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    one = lora_llm.generate([prompt], greedy, lora_request=lora,
                            use_tqdm=False)[0].outputs[0].token_ids
    base = lora_llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    assert one != base
    # Seeded samples: child i of n=2 draws as a lone request with seed + i.
    def sampled(seed, lora_request=lora, n=1):
        out = lora_llm.generate([prompt], SamplingParams(
            n=n, temperature=1.0, seed=seed, max_tokens=5),
            lora_request=lora_request, use_tqdm=False)[0]
        return [c.token_ids for c in out.outputs]
    two = sampled(7, n=2)
    assert two == sampled(7) + sampled(8)
    assert two[0] != sampled(7, None)[0]
    beams = lora_llm.beam_search([prompt], BeamSearchParams(
        beam_width=1, max_tokens=5, ignore_eos=True), lora_request=lora)
    assert beams[0].sequences[0].tokens[len(prompt["prompt_token_ids"]):] == one
    chat = [{"role": "user", "content": "Name a colour."}]
    with_lora = lora_llm.chat(chat, greedy, use_tqdm=False, lora_request=lora)
    ids = with_lora[0].prompt_token_ids
    want = lora_llm.generate([{"prompt_token_ids": ids}], greedy,
                             lora_request=lora, use_tqdm=False)
    assert with_lora[0].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_slot_loads_compile_nothing(lora_llm, adapters):
    """Once a LoRA step of a shape has run, any adapter in any slot runs
    the same program (the pool's shape is fixed)."""
    requests = list(_lora_requests(adapters).values())
    runner = lora_llm.llm_engine.runner
    sp = SamplingParams(temperature=0.0, max_tokens=4)
    for i in (0, 1):  # compiled, and a then b in the two slots
        prompt = {"prompt_token_ids": list(range(2000 + 50 * i, 2020 + 50 * i))}
        lora_llm.generate([prompt], sp, lora_request=requests[i],
                          use_tqdm=False)
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    loads = runner.lora.num_slot_loads
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for i in (2, 0, 1):  # each evicts the least recently used
            prompt = {"prompt_token_ids": list(range(3000 + 50 * i,
                                                     3020 + 50 * i))}
            lora_llm.generate([prompt], sp, lora_request=requests[i],
                              use_tqdm=False)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert runner.lora.num_slot_loads >= loads + 3
    assert events == [], f"{len(events)} compilations for slot loads"


def test_warmup_compiles_the_lora_variants(base_path, adapters, lora_cache_dir):
    """After warm-up, steps with and without adapters, greedy and sampled,
    and the slot loads compile nothing."""
    from jaxinfer import LLM
    llm = LLM(base_path, dtype="float32", max_model_len=64, max_num_seqs=4,
              max_num_batched_tokens=16, num_gpu_blocks_override=32,
              enable_lora=True, max_loras=1, max_lora_rank=8, warmup=True,
              compilation_cache_dir=lora_cache_dir)
    runner = llm.llm_engine.runner
    shapes = runner.programs.buckets.all_shapes()
    forward = [key for key in runner.programs.built if key[0] == "forward"]
    # With and without adapters, for each shape and each prefill shape's
    # prompt-logprob variant.
    prefill = [shape for shape in shapes if not shape.decode_only]
    assert len(forward) == 2 * (len(shapes) + len(prefill))
    # The sampler's programs do not depend on LoRA: three plain ones and
    # one full tier per bias width, per S.
    from jaxinfer.worker.sampler_widths import bias_widths
    samplers = [key for key in runner.programs.built if key[0] == "sample"]
    assert len(samplers) == (3 + len(bias_widths(
        runner.programs.cfg.vocab_size))) * len({shape[1] for shape in shapes})
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    requests = list(_lora_requests(adapters).values())
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for i, lora in enumerate([requests[0], None, requests[1], requests[2]]):
            llm.generate([{"prompt_token_ids": list(range(50 + i, 70 + i))}] * 2,
                         [SamplingParams(max_tokens=3, temperature=0.0),
                          SamplingParams(max_tokens=3, temperature=1.0,
                                         top_p=0.9, seed=i)],
                         lora_request=lora, use_tqdm=False)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert runner.lora.num_slot_loads == 3
    assert events == [], f"{len(events)} compilations after warm-up"


def test_multi_step_windows_run_each_rows_adapter(lora_llm, base_path, adapters,
                                                  lora_cache_dir):
    """Decode windows (num_scheduler_steps) keep each row on its adapter for
    every step of the window: the same tokens as single steps, with two
    adapters and the base model in one batch."""
    from jaxinfer import LLM

    from .conftest import ENGINE
    requests = _lora_requests(adapters)
    names = list(requests)[:2]
    cases = [(names[0], [5, 6, 7]), (names[1], [5, 6, 7]), ("base", [5, 6, 7])]
    windowed = LLM(base_path, compilation_cache_dir=lora_cache_dir,
                   **dict(ENGINE, num_scheduler_steps=4))
    before = windowed.llm_engine.num_steps
    got = _generate(windowed, cases, requests)
    assert windowed.llm_engine.num_steps - before < MAX_TOKENS - 6  # windows ran
    want = _generate(lora_llm, cases, requests)
    assert got == want
    assert len({tuple(t) for t, _ in got}) == 3  # each row its own model
