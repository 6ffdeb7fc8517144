"""Issue 12's engine-speed workloads on one H200 in one command (llama3-8b
shape, dummy bf16 weights): time to ready (weights loaded, every bucket
compiled) cold and warm, then throughput 1000 x 1000/1000, 256 x 1000/1000
and 256 x 512/256 and latency at batch 1 (128/128, 1024/256) on one engine,
each with its step timeline, plus the copy bandwidth and matmul rate the
timelines' rooflines use. GPU machine, repo root, the embedded tokenizer
saved in .tok (carried):

    export PYTHONPATH=$PWD
    python3 benchmarks/engine_speed.py --out $OUT [--only tp256-512,lat128]

Writes ``summary.json`` (bench records, ready times, rooflines) and
``<workload>.steps.jsonl`` timelines; `benchmarks/timeline_report.py DIR
--png` draws them. Every workload runs on the same engine (max_model_len
2048, the engine's defaults otherwise), warmed up once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ENGINE = dict(model="benchmarks/models/llama3-8b", load_format="dummy",
              dtype="bfloat16", max_model_len=2048)

# name: (kind, num_prompts or batch, input_len, output_len)
WORKLOADS = {
    "tp1000-1000": ("throughput", 1000, 1000, 1000),
    "tp256-1000": ("throughput", 256, 1000, 1000),
    "tp256-512": ("throughput", 256, 512, 256),
    "lat128": ("latency", 1, 128, 128),
    "lat1024": ("latency", 1, 1024, 256),
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
    return dict(bw=2 * x.numel() * 2 / t_copy, flops=2 * 8192**3 / t_mm,
                device=torch.cuda.get_device_name())


def make_llm(tokenizer: str, cache_dir: str):
    from jaxinfer import LLM
    return LLM(tokenizer=tokenizer, warmup=True,
               compilation_cache_dir=cache_dir, **ENGINE)


def ready(tokenizer: str, cache_dir: str) -> None:
    """--ready: start an engine, print the seconds to ready as JSON."""
    t0 = time.perf_counter()
    llm = make_llm(tokenizer, cache_dir)
    e = llm.llm_engine
    print(json.dumps({"ready_s": time.perf_counter() - t0,
                      "warmup_s": e.warmup_seconds,
                      "programs": e.warmup_programs}))


def run_workload(llm, name: str, out_dir: str) -> dict:
    import numpy as np

    from jaxinfer import SamplingParams
    from jaxinfer.engine.step_timeline import StepTimeline
    kind, n, n_in, n_out = WORKLOADS[name]
    engine = llm.llm_engine
    # Fresh prompts per workload and an empty prefix cache: no workload
    # reuses another's prompts (vLLM's random prompts share nothing).
    rng = np.random.default_rng(list(WORKLOADS).index(name) + 1)
    engine.reset_prefix_cache()
    vocab = engine.model_config.vocab_size
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=n_out,
                        ignore_eos=True, detokenize=False)

    def prompts(k):
        return [{"prompt_token_ids": rng.integers(100, vocab, n_in).tolist()}
                for _ in range(k)]
    if kind == "latency":  # one untimed batch, then the timed ones
        llm.generate(prompts(n), sp, use_tqdm=False)
    engine.timeline = StepTimeline(os.path.join(out_dir, f"{name}.steps.jsonl"))
    engine._last_ready = None
    engine.runner.device_seconds = 0.0
    times = []
    for _ in range(3 if kind == "latency" else 1):
        batch = prompts(n)
        t0 = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    engine.timeline.close()
    engine.timeline = None
    n_gen = sum(len(o.outputs[0].token_ids) for o in outs)
    rec = dict(workload=kind, num_prompts=n, input_len=n_in, output_len=n_out,
               elapsed_s=sum(times), repeats_s=times,
               output_tokens=n_gen * len(times),
               device_busy_fraction=engine.runner.device_seconds / sum(times))
    rec["output_tokens_per_s"] = rec["output_tokens"] / rec["elapsed_s"]
    if kind == "latency":
        rec["ms_per_token"] = 1e3 * min(times) / n_out
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--cache-dir", default="/tmp/jaxinfer-xla-cache")
    ap.add_argument("--ready", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip-ready", action="store_true")
    args = ap.parse_args()
    if args.ready:
        ready(args.tokenizer, args.cache_dir)
        return 0
    os.makedirs(args.out, exist_ok=True)
    summary = {"commit": subprocess.run(["git", "rev-parse", "HEAD"],
                                        capture_output=True, text=True).stdout.strip(),
               "engine": ENGINE, "runs": {}}
    summary["roofline"] = measure_roofline()
    path = os.path.join(args.out, "summary.json")

    def save():
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    if not args.skip_ready:  # cold (empty cache), then warm, each a process
        for which in ("cold", "warm"):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, __file__, "--out", args.out,
                                "--ready", "--tokenizer", args.tokenizer,
                                "--cache-dir", args.cache_dir],
                               capture_output=True, text=True)
            lines = p.stdout.strip().splitlines()
            summary[f"ready_{which}"] = (json.loads(lines[-1]) if p.returncode == 0
                                         else {"rc": p.returncode, "tail": p.stderr[-2000:]})
            summary[f"ready_{which}"]["process_s"] = time.perf_counter() - t0
            print(f"ready {which}: {summary[f'ready_{which}']}", flush=True)
            save()
    t0 = time.perf_counter()
    llm = make_llm(args.tokenizer, args.cache_dir)
    summary["ready_in_process_s"] = time.perf_counter() - t0
    for name in args.only.split(","):
        rec = run_workload(llm, name, args.out)
        summary["runs"][name] = {"rc": 0, "bench": rec}
        print(f"[{name}] {json.dumps(rec)[:300]}", flush=True)
        save()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timeline_report import report_dir
    print(report_dir(args.out, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
