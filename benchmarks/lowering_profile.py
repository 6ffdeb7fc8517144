"""Where a step program's lowering goes (the serial part of a cold or
cache-warm warm-up): builds the llama3-8b-shaped engine without warm-up,
lowers the first ``--programs`` programs warm-up would build (its own
order, `warmup.wanted_programs`) under cProfile, and prints the seconds per
program and the functions with the most cumulative time. GPU machine, repo
root, the embedded tokenizer saved in .tok (carried)::

    PYTHONPATH=$PWD python3 benchmarks/lowering_profile.py --out $OUT [--programs 4]

Writes ``lowering-profile.json`` (per-program seconds, top functions).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--programs", type=int, default=4)
    ap.add_argument("--model", default="benchmarks/models/llama3-8b")
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    import jax

    from jaxinfer import LLM
    from jaxinfer.worker.warmup import wanted_programs
    llm = LLM(args.model, tokenizer=args.tokenizer, load_format="dummy",
              dtype="bfloat16", max_model_len=2048, warmup=False,
              compilation_cache_dir="")
    runner = llm.llm_engine.runner
    todo = wanted_programs(runner.programs, runner.device_state())
    keys = list(todo)[:args.programs]
    rows = []
    prof = cProfile.Profile()
    for key in keys:
        jitted, static, dyn = todo[key]
        t0 = time.perf_counter()
        traced = jitted.trace(*static, *dyn)
        t1 = time.perf_counter()
        prof.enable()
        traced.lower()
        prof.disable()
        t2 = time.perf_counter()
        rows.append({"key": repr(key)[:200], "trace_s": round(t1 - t0, 3),
                     "lower_s": round(t2 - t1, 3)})
        print(json.dumps(rows[-1]), flush=True)
    buf = io.StringIO()
    for order in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(args.top)
    text = buf.getvalue()
    print(text)
    with open(os.path.join(args.out, "lowering-profile.json"), "w") as f:
        json.dump({"device": str(jax.devices()[0]), "jax": jax.__version__,
                   "programs": rows, "profile_top": text}, f, indent=1)


if __name__ == "__main__":
    main()
