"""Every workload of the speed targets on one GPU, in one command, and the
targets checked against what it measured (llama3-8b shape, random weights):

- ``bf16``: 1000 x 1000/1000, 256 x 512/256 and batch 1 (128/128,
  1024/256) on one bf16 engine;
- ``fp8``: 1000 x 1000/1000 with fp8 weights and fp8 KV pages
  (``quantization="fp8"``, ``kv_cache_dtype="fp8"``), as ``jaxinfer bench
  throughput`` runs it;
- ``int4``: batch 1 (128/128, 1024/256) on an AWQ checkpoint's layout
  (4-bit groups of 128);
- ``fp8-attention``: the fp8-page decode attention kernel alone against the
  copy bandwidth (S=64 L=2048).

GPU machine, repo root, the embedded tokenizer saved in .tok (carried):

    export PYTHONPATH=$PWD
    python3 benchmarks/speed_targets.py --out $OUT [--parts bf16,fp8] [--budget 590]

Each part runs in its own process under what is left of ``--budget``
seconds and writes ``OUT/<part>/`` (engine parts: engine_speed.py's
summary.json, step timelines and PNGs). A part already done in OUT is kept,
so the parts may run in separate calls into one folder; a part cut off by
a call's limit runs again in the next call (on the same held machine it
loads the programs the first call compiled, ``--cache-dir``). Last,
``OUT/targets.json`` holds each target with its measured value and whether
it holds; ``--targets-only`` rebuilds it from OUT without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE_SPEED = os.path.join(HERE, "engine_speed.py")
MODEL = os.path.join(HERE, "models", "llama3-8b")

PARTS = ("bf16", "fp8", "int4", "fp8-attention")
# The engines' compiled programs, in the repository's ignored .jax_cache:
# the device machine keeps ignored files between calls while it stays
# held, so a part cut off by one call's limit (the fp8 engine builds for
# about 470 s on an H100) loads its programs in the next call instead of
# building them again.
CACHE_DIR = os.path.join(".jax_cache", "speed-targets")
# What the fp8-attention part writes (bench_decode_fp8.py's name, on any card).
ATTENTION_FILE = "decode-fp8-mgpu-h200.json"
# The fp8 attention tunings timed beside the default (pallas_kernels/NOTES.md).
FP8_ATTENTION_VARIANTS = "default"


def awq_folder(dst: str, tokenizer: str) -> str:
    """llama3-8b's config with AWQ's quantization_config (dummy weights
    take the checkpoint's layout from it) and the tokenizer's files."""
    from benchmarks.int4_engine_check import AWQ
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(quantization_config=AWQ, torch_dtype="float16")
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    for name in os.listdir(tokenizer):
        if name != "config.json":
            shutil.copy(os.path.join(tokenizer, name), dst)
    return dst


def part_command(part: str, out: str, tokenizer: str,
                 fp8_variants: str, cache_dir: str = CACHE_DIR) -> list[str]:
    py = [sys.executable]
    speed = py + [ENGINE_SPEED, "--out", out, "--skip-ready",
                  "--tokenizer", tokenizer,
                  "--cache-dir", os.path.abspath(cache_dir)]
    if part == "bf16":
        return speed + ["--only", "tp1000-1000,tp256-512,lat128,lat1024"]
    if part == "fp8":
        return speed + ["--engine", "quantization=fp8",
                        "--engine", "kv_cache_dtype=fp8",
                        "--only", "tp1000-1000"]
    if part == "int4":
        folder = awq_folder(os.path.join(out, "model"), tokenizer)
        # Batch 1 only: a few sequence slots keep warm-up to the small
        # buckets (the one-sequence step's program is the same).
        return speed + ["--model", folder, "--engine", "max_num_seqs=16",
                        "--only", "lat128,lat1024"]
    if part == "fp8-attention":
        return py + [os.path.join(HERE, "kernels", "bench_decode_fp8.py"),
                     "--out", out, "--pipeline", f"--only={fp8_variants}"]
    raise SystemExit(f"unknown part {part!r}: one of {', '.join(PARTS)}")


def part_done(part: str, out: str) -> bool:
    if part == "fp8-attention":
        return os.path.exists(os.path.join(out, ATTENTION_FILE))
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        runs = json.load(f).get("runs", {})
    return bool(runs) and all("timeline" in r for r in runs.values())


def _load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _run(summary: dict | None, name: str) -> dict | None:
    run = (summary or {}).get("runs", {}).get(name)
    return run if run and "timeline" in run else None


def targets(out: str) -> list[dict]:
    """Each target: what it asks, the measured value, whether it holds
    (None where its part has not run)."""
    bf16 = _load(os.path.join(out, "bf16", "summary.json"))
    fp8 = _load(os.path.join(out, "fp8", "summary.json"))
    int4 = _load(os.path.join(out, "int4", "summary.json"))
    attn = _load(os.path.join(out, "fp8-attention", ATTENTION_FILE))
    rows = []

    def add(name, value, goal, unit, **extra):
        rows.append(dict(target=name, value=value, goal=goal, unit=unit,
                         holds=None if value is None else value >= goal,
                         **extra))

    for w in ("tp1000-1000", "tp256-512"):
        r = _run(bf16, w)
        t = r["timeline"] if r else {}
        add(f"bf16 {w}: fraction of the serial bound", t.get("serial_fraction"),
            0.85, "fraction",
            output_tok_s=r and r["bench"]["output_tokens_per_s"],
            overlapped_fraction=t.get("roofline_fraction"))
    r = _run(fp8, "tp1000-1000")
    # A run cut off before its end leaves the target open; what it decoded
    # until then is kept beside it.
    cut = None if r else ((fp8 or {}).get("cut_off") or {}).get("tp1000-1000")
    add("fp8 weights + fp8 KV tp1000-1000: output tok/s",
        r and r["bench"]["output_tokens_per_s"], 18000.0, "tok/s",
        serial_fraction=r and r["timeline"].get("serial_fraction"),
        overlapped_fraction=r and r["timeline"].get("roofline_fraction"),
        **({"cut_off": {k: cut[k] for k in (
            "elapsed_s", "decode_tokens", "decode_tokens_per_s",
            "serial_fraction", "running_max")}} if cut else {}))
    for w in ("lat128", "lat1024"):
        r = _run(bf16, w)
        add(f"bf16 batch 1 {w}: fraction of the per-token roofline",
            r and r["timeline"].get("roofline_fraction"), 0.85, "fraction",
            ms_per_token=r and r["bench"]["ms_per_token"])
        q = _run(int4, w)
        add(f"int4 AWQ batch 1 {w}: speed-up over bf16",
            (r["bench"]["ms_per_token"] / q["bench"]["ms_per_token"]
             if r and q else None), 2.0, "x",
            int4_ms_per_token=q and q["bench"]["ms_per_token"])
    best = None
    for row in (attn or {}).get("rows", []):
        if row.get("pages") == "fp8" and row.get("copy_bw_fraction"):
            if best is None or row["copy_bw_fraction"] > best["copy_bw_fraction"]:
                best = row
    add("fp8 KV decode attention: fraction of copy bandwidth",
        best and best["copy_bw_fraction"], 0.75, "fraction",
        variant=best and best["variant"], us=best and best["us"])
    return rows


def devices(out: str) -> dict[str, str]:
    """The GPU each part that ran measured on (parts may run in separate
    calls, so on different cards)."""
    found = {}
    for part in PARTS:
        if part == "fp8-attention":
            d = _load(os.path.join(out, part, ATTENTION_FILE))
            device = (d or {}).get("device")
        else:
            d = _load(os.path.join(out, part, "summary.json"))
            device = ((d or {}).get("roofline") or {}).get("device")
        if device:
            found[part] = device
    return found


def table(rows: list[dict]) -> str:
    lines = [f"{'target':58} {'measured':>10} {'goal':>8}  holds"]
    for r in rows:
        v = "-" if r["value"] is None else f"{r['value']:.3g}"
        lines.append(f"{r['target']:58} {v:>10} {r['goal']:>8.3g}  "
                     f"{'-' if r['holds'] is None else r['holds']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--budget", type=float, default=3600.0,
                    help="seconds for all parts together")
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--fp8-attention-variants", default=FP8_ATTENTION_VARIANTS)
    ap.add_argument("--cache-dir", default=CACHE_DIR,
                    help="the engines' persistent compilation cache")
    ap.add_argument("--redo", action="store_true",
                    help="run parts already done in OUT again")
    ap.add_argument("--targets-only", action="store_true")
    args = ap.parse_args()
    start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.getcwd(), HERE, os.environ.get("PYTHONPATH")) if p)}
    for part in ([] if args.targets_only else args.parts.split(",")):
        out = os.path.join(args.out, part)
        if part_done(part, out) and not args.redo:
            print(f"[{part}] done already in {out}", flush=True)
            continue
        left = args.budget - (time.monotonic() - start)
        if left < 60:
            print(f"[{part}] skipped: {left:.0f} s left", flush=True)
            continue
        os.makedirs(out, exist_ok=True)
        cmd = part_command(part, out, args.tokenizer,
                           args.fp8_attention_variants, args.cache_dir)
        t0 = time.monotonic()
        with open(os.path.join(out, "run.log"), "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, timeout=left).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        print(f"[{part}] rc={rc} in {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0 and os.path.exists(os.path.join(out, "summary.json")):
            # An engine part stopped mid-workload: summarize what its
            # timelines hold so far (engine_speed.py saves the summary
            # before the workloads).
            from benchmarks.timeline_report import report_dir
            print(report_dir(out), flush=True)
    rows = targets(args.out)
    with open(os.path.join(args.out, "targets.json"), "w") as f:
        json.dump({"workload": "speed targets", "devices": devices(args.out),
                   "command": "python3 benchmarks/speed_targets.py --out OUT",
                   "targets": rows}, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
