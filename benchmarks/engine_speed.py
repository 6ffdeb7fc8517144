"""The engine-speed workloads of one H200 in one command (llama3-8b shape,
dummy bf16 weights): throughput 1000 x 1000/1000, 256 x 1000/1000 and
256 x 512/256, latency at batch 1 (128/128 and 1024/256), each with its step
timeline, plus the measured copy bandwidth and matmul rate that the
timelines' rooflines use. GPU machine, repo root, the embedded tokenizer
saved in .tok (carried):

    export PYTHONPATH=$PWD
    python3 benchmarks/engine_speed.py --out $OUT [--only tp256-512,lat128]

Each workload runs in its own process (`jaxinfer bench ...`, so a failure or
an out-of-memory stays in its row) and writes ``<name>.json`` (the bench
record) and ``<name>.steps.jsonl`` (the timeline). ``summary.json`` gathers
them with the roofline of each run: `benchmarks/timeline_report.py` has the
formula (BENCHMARKS.md's, summed over the run's own steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODEL = ["--model", "benchmarks/models/llama3-8b", "--load-format", "dummy",
         "--dtype", "bfloat16", "--disable-detokenize"]

WORKLOADS = {
    # name: (bench kind, args)
    "tp1000-1000": ("throughput", ["--num-prompts", "1000", "--input-len", "1000",
                                   "--output-len", "1000", "--max-model-len", "2048"]),
    "tp256-1000": ("throughput", ["--num-prompts", "256", "--input-len", "1000",
                                  "--output-len", "1000", "--max-model-len", "2048"]),
    "tp256-512": ("throughput", ["--num-prompts", "256", "--input-len", "512",
                                 "--output-len", "256", "--max-model-len", "1024"]),
    "lat128": ("latency", ["--batch-size", "1", "--input-len", "128",
                           "--output-len", "128", "--num-iters", "3",
                           "--max-model-len", "2048"]),
    "lat1024": ("latency", ["--batch-size", "1", "--input-len", "1024",
                            "--output-len", "256", "--num-iters", "3",
                            "--max-model-len", "2048"]),
}


def measure_roofline() -> dict:
    """BENCHMARKS.md's ceilings: torch copy_ of 2 GiB (bytes read + written)
    and an 8192^3 bf16 matmul, medians of events-timed repeats."""
    import statistics

    import torch
    x = torch.empty(2**30, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

    def timed(fn, n=10):
        for _ in range(3):
            fn()
        out = []
        for _ in range(n):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        return statistics.median(out)
    t_copy = timed(lambda: y.copy_(x))
    t_mm = timed(lambda: a @ b)
    res = dict(bw=2 * x.numel() * 2 / t_copy, flops=2 * 8192**3 / t_mm,
               device=torch.cuda.get_device_name())
    del x, y, a, b
    torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--warmup", default="dry-run")
    ap.add_argument("--extra", default="", help="more bench flags, for all")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    summary = {"roofline": measure_roofline(), "runs": {},
               "commit": subprocess.run(["git", "rev-parse", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()}
    for name in args.only.split(","):
        kind, wargs = WORKLOADS[name]
        out_json = os.path.join(args.out, f"{name}.json")
        steps = os.path.join(args.out, f"{name}.steps.jsonl")
        cmd = [sys.executable, "-m", "jaxinfer.entrypoints.cli", "bench", kind,
               *MODEL, "--tokenizer", args.tokenizer, *wargs,
               "--warmup", args.warmup, "--output-json", out_json,
               "--profile-steps", steps, *args.extra.split()]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        print(f"[{name}] rc={proc.returncode} {wall:.0f}s: " + " | ".join(tail),
              flush=True)
        run = {"rc": proc.returncode, "wall_s": wall, "cmd": " ".join(cmd),
               "tail": tail}
        if os.path.exists(out_json):
            run["bench"] = json.load(open(out_json))
        summary["runs"][name] = run
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timeline_report import report_dir
    print(report_dir(args.out, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
