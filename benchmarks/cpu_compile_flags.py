"""What XLA CPU flags do to the compile time the test suite pays, and to the
step time after: a tiny 2-layer engine (the engine tests' configuration,
no persistent cache) compiles its greedy and sampled step programs, then
runs the same requests again warm. One subprocess per flag set, in turn, so
each starts cold; one JSON line per run, and a table last.

    PYTHONPATH=$PWD python benchmarks/cpu_compile_flags.py [--repeats 2]
        [--out benchmarks/results/cpu-compile-flags.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

VARIANTS = {
    "default": "",
    "opt0": "--xla_backend_optimization_level=0",
    "no_fusion_emitters": "--xla_cpu_use_fusion_emitters=false",
    "split1": "--xla_cpu_parallel_codegen_split_count=1",
    "no_xnnpack": "--xla_cpu_use_xnnpack=false",
}

CHILD = r"""
import json, sys, time
import jax, jax.monitoring
from collections import Counter
secs = Counter()
def listen(event, duration, **_):
    if event.startswith("/jax/core/compile/"):
        secs[event.rsplit("/", 1)[-1]] += duration
jax.monitoring.register_event_duration_secs_listener(listen)
from jaxinfer import LLM, SamplingParams
path = sys.argv[1]
llm = LLM(path, dtype="float32", max_model_len=128, max_num_seqs=8,
          max_num_batched_tokens=32, block_size=16, compilation_cache_dir="")
import random
rng = random.Random(0)
prompts = [[rng.randrange(3, 49152) for _ in range(rng.randrange(4, 60))]
           for _ in range(8)]
params = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
          SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=20,
                         seed=1, ignore_eos=True)]
def run():
    for p in params:
        llm.generate([{"prompt_token_ids": x} for x in prompts], p,
                     use_tqdm=False)
t0 = time.perf_counter(); run(); t1 = time.perf_counter()
cold = dict(secs)
run(); run(); t2 = time.perf_counter()
print("RESULT " + json.dumps({
    "cold_s": round(t1 - t0, 2), "warm_s": round((t2 - t1) / 2, 3),
    "compile_s": {k: round(v, 2) for k, v in cold.items()}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from tests.tiny_models import make_tiny_model
    folder = make_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-"), "llama",
                             "default")
    rows = []
    for rep in range(args.repeats):
        for name in args.variants.split(","):
            env = dict(os.environ, XLA_FLAGS=VARIANTS[name],
                       JAXINFER_COMPILATION_CACHE_DIR="")
            proc = subprocess.run([sys.executable, "-c", CHILD, folder],
                                  env=env, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                print(name, "failed:", proc.stderr[-2000:], file=sys.stderr)
                continue
            row = dict(variant=name, flags=VARIANTS[name], repeat=rep,
                       **json.loads(line[0][7:]))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'variant':20s} {'cold s':>8s} {'compile s':>10s} {'warm s':>8s}")
    for r in rows:
        print(f"{r['variant']:20s} {r['cold_s']:8.2f} "
              f"{r['compile_s'].get('backend_compile_duration', 0):10.2f} "
              f"{r['warm_s']:8.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
