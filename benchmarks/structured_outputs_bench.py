"""Cost of structured outputs: the in-step mask (sampler alone, and whole
decode steps through the engine) with every row under the 20-field nested
schema vs unconstrained, the host's mask fill for S rows, and grammar
compile time cold / cached. Writes JSON under $OUT (or --out).

GPU (llama3-8b shape, random weights, the embedded model's tokenizer in
.tok): the grammar's EOS must be a token of that tokenizer, so the config
is copied with SmolLM2's BOS/EOS ids (1, 2) first:
    mkdir -p /tmp/l3 && python3 -c "import json; c = json.load(open(
        'benchmarks/models/llama3-8b/config.json')); c.update(bos_token_id=1,
        eos_token_id=2); json.dump(c, open('/tmp/l3/config.json', 'w'))"
    python benchmarks/structured_outputs_bench.py \
        --model /tmp/l3 --load-format dummy --num-seqs 256 --tokenizer .tok
CPU check at a tiny size:
    python benchmarks/structured_outputs_bench.py --num-seqs 4 --max-tokens 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from structured_schemas import NESTED_20


def _timed(fn, reps):
    fn()  # compile / warm
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return 1e3 * (time.perf_counter() - t0) / reps


def sampler_ms(S, V, reps):
    """The sampler program alone at [S, V]: greedy vs greedy + mask."""
    import jax
    import jax.numpy as jnp

    from jaxinfer.worker.sampler import SamplingMetadata, sample
    logits = jax.random.normal(jax.random.key(0), (S, V), jnp.float32)
    words = jnp.asarray(np.random.default_rng(0).integers(
        -2**31, 2**31 - 1, (S, (V + 31) // 32), dtype=np.int64).astype(np.int32))
    run = jax.jit(lambda x, md: sample(x, md).token_ids)
    plain = SamplingMetadata()
    masked = SamplingMetadata(token_bitmask=words)
    return {"unconstrained_ms": _timed(lambda: run(logits, plain).block_until_ready(), reps),
            "masked_ms": _timed(lambda: run(logits, masked).block_until_ready(), reps)}


def host_fill_ms(compiler, S, reps):
    """Filling S rows' masks on the host (parallel over rows)."""
    from jaxinfer.structured.bitmask import fill_bitmasks
    from jaxinfer.structured.params import StructuredOutputsParams
    compiled = compiler.compile(StructuredOutputsParams(json=NESTED_20))
    matchers = [compiled.matcher() for _ in range(S)]
    return _timed(lambda: fill_bitmasks(matchers), reps)


def engine_ms_per_step(llm, S, max_tokens, constrained):
    """Wall time per engine step over a batch of S requests."""
    from jaxinfer import SamplingParams
    from jaxinfer.structured.params import StructuredOutputsParams
    so = StructuredOutputsParams(json=NESTED_20) if constrained else None
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                        ignore_eos=True, structured_outputs=so)
    prompts = [{"prompt_token_ids": [1 + i % 50, 7, 9, 11]} for i in range(S)]
    llm.generate(prompts, sp, use_tqdm=False)  # compile this variant
    engine = llm.llm_engine
    steps0 = engine.num_steps
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    steps = engine.num_steps - steps0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"ms_per_step": 1e3 * dt / max(steps, 1), "steps": steps,
            "tokens": tokens, "tokens_per_s": tokens / dt}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None,
                    help="a tokenizer folder for a model folder without one "
                    "(the random-weight shapes: the embedded one saved in .tok)")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    import jax

    from jaxinfer import LLM
    from jaxinfer.structured.grammar import GrammarCompiler
    from jaxinfer.structured.params import StructuredOutputsParams
    llm = LLM(a.model, tokenizer=a.tokenizer, load_format=a.load_format,
              max_num_seqs=a.num_seqs,
              max_model_len=512, max_num_batched_tokens=max(a.num_seqs * 4, 256))
    engine = llm.llm_engine
    V = engine.model_config.vocab_size
    compiler = GrammarCompiler(engine.tokenizer, V, engine.eos_token_ids)
    _ = compiler.ll_tokenizer  # built once per tokenizer, outside the compile
    t0 = time.perf_counter()
    compiler.compile(StructuredOutputsParams(json=NESTED_20))
    cold = 1e3 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    compiler.compile(StructuredOutputsParams(json=NESTED_20))
    cached = 1e3 * (time.perf_counter() - t0)
    result = {
        "device": str(jax.devices()[0]), "model": a.model, "vocab": V,
        "num_seqs": a.num_seqs, "max_tokens": a.max_tokens,
        "compile_cold_ms": cold, "compile_cached_ms": cached,
        "host_mask_fill_ms": host_fill_ms(compiler, a.num_seqs, a.reps),
        "sampler": sampler_ms(a.num_seqs, V, a.reps),
        "engine_unconstrained": engine_ms_per_step(llm, a.num_seqs,
                                                   a.max_tokens, False),
        "engine_constrained": engine_ms_per_step(llm, a.num_seqs,
                                                 a.max_tokens, True),
    }
    u = result["engine_unconstrained"]["ms_per_step"]
    c = result["engine_constrained"]["ms_per_step"]
    result["engine_step_overhead_pct"] = 100.0 * (c - u) / u
    s = result["sampler"]
    result["sampler_overhead_pct"] = 100.0 * (
        s["masked_ms"] - s["unconstrained_ms"]) / s["unconstrained_ms"]
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "structured-outputs.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
