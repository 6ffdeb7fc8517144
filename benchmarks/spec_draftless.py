"""What speculative decoding costs on steps where nothing can be drafted:
64 sampled requests (temperature 1 on random weights: no n-gram of the
output recurs) decoded by an engine with and without n-gram speculation,
each in its own process; counts each step's bucket and whether it
verified drafts. CPU, repo root:

    python benchmarks/spec_draftless.py --out /tmp/sdl

Writes ``spec-draftless.json``: per engine the second run's wall time
(the first builds its programs) and its steps by (bucket, verified).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_stamp import run_stamp

NGRAM = {"method": "ngram", "num_speculative_tokens": 4,
         "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def child(ns) -> dict:
    import jaxinfer.worker.step_programs as step_programs
    from jaxinfer import LLM, SamplingParams
    kw = dict(model=ns.model, load_format="dummy", tokenizer=ns.tokenizer,
              dtype="float32", max_model_len=512, max_num_seqs=ns.num_seqs,
              max_num_batched_tokens=2048)
    if ns.child == "spec":
        kw["speculative_config"] = NGRAM
    llm = LLM(**kw)
    steps: collections.Counter = collections.Counter()
    run = step_programs.StepPrograms.run

    def counted(self, state, inputs, penalty_state):
        steps[f"{tuple(inputs.bucket)} verified={inputs.drafts is not None}"] += 1
        return run(self, state, inputs, penalty_state)
    step_programs.StepPrograms.run = counted
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(100, 40000)
                                     for _ in range(ns.prompt_len)]}
               for _ in range(ns.num_seqs)]
    sp = SamplingParams(temperature=1.0, seed=3, max_tokens=ns.output_len,
                        ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)
    steps.clear()
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    stats = llm.llm_engine.get_stats().spec_decode
    return {"wall_s": wall, "steps": dict(steps),
            "num_drafts": None if stats is None else stats.num_drafts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="benchmarks/models/tiny-llama")
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--num-seqs", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=384)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--child", choices=["plain", "spec"])
    ns = ap.parse_args()
    if ns.child:
        print(json.dumps(child(ns)))
        return 0
    result = {"workload": f"{ns.num_seqs} sampled requests, {ns.prompt_len} in / "
              f"{ns.output_len} out, tiny random Llama, n-gram speculation "
              "with nothing to draft", "speculative_config": NGRAM,
              **run_stamp()}
    for which in ("plain", "spec"):
        done = subprocess.run([sys.executable, *sys.argv, "--child", which],
                              capture_output=True, text=True, check=True)
        result[which] = json.loads(done.stdout.strip().splitlines()[-1])
    result["spec_over_plain_wall"] = (result["spec"]["wall_s"]
                                      / result["plain"]["wall_s"])
    os.makedirs(ns.out, exist_ok=True)
    with open(os.path.join(ns.out, "spec-draftless.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
