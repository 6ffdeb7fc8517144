"""A first request's programs on CPU: the README's first
command's phases in-process, with one change on and off, in alternating
fresh processes (warm weight and compilation caches).

    python benchmarks/cpu_first_programs.py [--compare WHAT] [--runs 6] [--out OUT.json]

``--compare build-first`` (default): the programs built while the weights
load (`BuildAhead.start_first`) or at the first step.
``--compare prefill-options``: the 16-token prefill compiled with the
few-row options (compile_options.py: XLA's dot emitter, whose programs'
first run skips YNNPACK's set-up) or with the default compile.

Each child process times: importing the CLI and building its parser,
``LLM()`` as ``jaxinfer generate`` makes it (one sequence slot), the first
and second streamed tokens and the 32nd of a greedy ``generate`` of the
README's prompt, from the child's first line. "off" changes only the compared
thing (with build-first off the decode program still builds ahead once the
prefill is dispatched: docs/performance.md, "CPU").
Prints the medians and writes every run and the medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "The capital of France is"


def child(mode: str, compare: str) -> None:
    t0 = time.perf_counter()
    marks = {}

    def mark(name):
        marks[name] = round(time.perf_counter() - t0, 3)
    from jaxinfer.entrypoints import cli
    ns = cli.build_parser().parse_args(
        ["generate", "--prompt", PROMPT, "--max-tokens", "32"])
    from jaxinfer.sampling_params import RequestOutputKind, SamplingParams
    from jaxinfer.worker import model_runner
    if mode == "off" and compare == "build-first":
        model_runner.ModelRunner.can_build_first = lambda self: False
    if mode == "off" and compare == "prefill-options":
        model_runner.PREFILL_OPTIONS_MAX_TOKENS = 0
    mark("imports")
    from jaxinfer.entrypoints.llm import LLM
    llm = LLM.from_engine_args(cli.generate_engine_args(ns))
    mark("llm")
    engine = llm.llm_engine
    engine.add_request(None, PROMPT, SamplingParams(
        max_tokens=32, temperature=0.0, ignore_eos=True,
        output_kind=RequestOutputKind.DELTA))
    n = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            n += len(out.outputs[0].token_ids)
            if n >= 1 and "first" not in marks:
                mark("first")
            if n >= 2 and "second" not in marks:
                mark("second")
    mark("done")
    print(json.dumps({"mode": mode, "tokens": n, **marks}), flush=True)
    os._exit(0)  # as `jaxinfer generate` ends


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", default="build-first",
                    choices=("build-first", "prefill-options"))
    ap.add_argument("--child", choices=("on", "off"))
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.compare)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run_stamp import run_stamp
    runs = []
    for _ in range(args.runs):
        for mode in ("on", "off"):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", mode,
                 "--compare", args.compare],
                capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    medians = {}
    for mode in ("on", "off"):
        rs = [r for r in runs if r["mode"] == mode]
        medians[mode] = {
            "imports_s": statistics.median(r["imports"] for r in rs),
            "llm_s": statistics.median(r["llm"] - r["imports"] for r in rs),
            "first_after_llm_s": statistics.median(r["first"] - r["llm"]
                                                   for r in rs),
            "first_token_s": statistics.median(r["first"] for r in rs),
            "second_token_s": statistics.median(r["second"] for r in rs),
            "done_s": statistics.median(r["done"] for r in rs)}
    print(f"{'':4} {'imports':>8} {'LLM()':>6} {'1st-LLM':>8} {'1st tok':>8} "
          f"{'2nd tok':>8} {'32 tok':>7}  (medians, s, from the child's start)")
    for mode, m in medians.items():
        print(f"{mode:4} {m['imports_s']:8.2f} {m['llm_s']:6.2f} "
              f"{m['first_after_llm_s']:8.2f} {m['first_token_s']:8.2f} "
              f"{m['second_token_s']:8.2f} {m['done_s']:7.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"workload": "cpu-first-programs",
                       "compare": args.compare, **run_stamp(),
                       "command": "python benchmarks/cpu_first_programs.py "
                       + " ".join(sys.argv[1:]),
                       "medians": medians, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
