"""The model-family targets on one H200 in one command (random bf16
weights): Mixtral-8x7B's decode step and grouped experts
(``moe_bench.py``), then ``bench throughput`` 1000 x 1000/1000 on the
Qwen3-30B-A3B and Gemma-2-9B shapes (``engine_speed.py --only
tp1000-1000``, each with its step timeline and its model's roofline,
``timeline_report.model_constants``). GPU machine, repo root, the embedded
tokenizer saved in .tok (carried; docs/benchmarking.md):

    export PYTHONPATH=$PWD
    python3 benchmarks/families_bench.py --out $OUT [--parts moe,qwen3-moe,gemma2]

Each part runs in its own process (one model on the GPU at a time) and
writes into its own folder under ``--out``; ``families-bench.json`` then
holds every part found there, against the targets (``TARGETS``), so parts
run in separate calls (``--parts``) are gathered by a last run with
``--parts none``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TARGETS = {
    # Mixtral-8x7B decode step, S=64 L=1024, against its roofline counting
    # only the experts the batch touches.
    "mixtral_decode_roofline_min": 0.75,
    # One layer's experts at S=256: grouped ragged_dot vs the dense loop.
    "grouped_vs_dense_min": 2.0,
    # 1000 x 1000/1000 against the run's roofline.
    "qwen3-moe_tp1000_roofline_min": 0.70,
    "gemma2_tp1000_roofline_min": 0.70,
}

PARTS = {
    "moe": [sys.executable, os.path.join(HERE, "moe_bench.py"),
            "--sizes", "64:1024", "--grouped-tokens", "256", "--sweep"],
    "qwen3-moe": [sys.executable, os.path.join(HERE, "engine_speed.py"),
                  "--model", os.path.join(HERE, "models", "qwen3-30b-a3b"),
                  "--only", "tp1000-1000", "--skip-ready"],
    "gemma2": [sys.executable, os.path.join(HERE, "engine_speed.py"),
               "--model", os.path.join(HERE, "models", "gemma-2-9b"),
               "--only", "tp1000-1000", "--skip-ready"],
}


def run_part(name: str, out: str, tokenizer: str, extra: list[str]) -> dict:
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    cmd = PARTS[name] + ["--out", d] + extra
    if name != "moe":
        cmd += ["--tokenizer", tokenizer]
    t0 = time.perf_counter()
    with open(os.path.join(d, "run.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    return {"rc": rc, "seconds": time.perf_counter() - t0}


def gather(out: str) -> dict:
    """Every part's figures found under ``out``, with the verdicts."""
    result: dict = {"targets": TARGETS, "parts": {}, "verdicts": {}}
    moe = os.path.join(out, "moe", "moe-bench.json")
    if os.path.exists(moe):
        m = json.load(open(moe))
        result["parts"]["moe"] = m
        d = next((r for r in m["decode"] if (r["S"], r["L"]) == (64, 1024)), None)
        if d:
            result["verdicts"]["mixtral_decode_roofline"] = {
                "value": d["roofline_fraction"],
                "holds": d["roofline_fraction"] >= TARGETS["mixtral_decode_roofline_min"]}
        g = m["grouped"]
        if g["S"] == 256:
            result["verdicts"]["grouped_vs_dense"] = {
                "value": g["speedup"],
                "holds": g["speedup"] >= TARGETS["grouped_vs_dense_min"]}
    for name in ("qwen3-moe", "gemma2"):
        path = os.path.join(out, name, "summary.json")
        if not os.path.exists(path):
            continue
        s = json.load(open(path))
        run = s["runs"].get("tp1000-1000", {})
        result["parts"][name] = {
            "engine": s.get("engine"), "roofline": s.get("roofline"),
            "roofline_model": s.get("roofline_model"),
            "commit": s.get("commit"), "bench": run.get("bench"),
            "timeline": run.get("timeline")}
        frac = (run.get("timeline") or {}).get("roofline_fraction")
        if frac is not None:
            result["verdicts"][f"{name}_tp1000_roofline"] = {
                "value": frac,
                "output_tokens_per_s": run["bench"]["output_tokens_per_s"],
                "holds": frac >= TARGETS[f"{name}_tp1000_roofline_min"]}
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="comma-separated parts to run, or 'none' to gather only")
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--mixtral-layers", type=int, default=None,
                    help="build this many of Mixtral's decoder layers (a GPU "
                         "that cannot hold all 32); the roofline counts the same")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = {}
    for name in [p for p in args.parts.split(",") if p and p != "none"]:
        if name not in PARTS:
            raise SystemExit(f"--parts: unknown part {name!r}; one of {sorted(PARTS)}")
        extra = (["--num-layers", str(args.mixtral_layers)]
                 if name == "moe" and args.mixtral_layers else [])
        runs[name] = run_part(name, args.out, args.tokenizer, extra)
        print(f"{name}: {runs[name]}", flush=True)
    result = gather(args.out)
    result["runs"] = runs
    with open(os.path.join(args.out, "families-bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    for key, v in result["verdicts"].items():
        print(f"{key:32} {v['value']:8.3f}  {'holds' if v['holds'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
