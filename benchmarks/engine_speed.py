"""The engine-speed workloads on one H200 in one command (llama3-8b
shape, dummy bf16 weights): time to ready (weights loaded, every bucket
compiled) cold and warm, then throughput 1000 x 1000/1000, 256 x 1000/1000
and 256 x 512/256 and latency at batch 1 (128/128, 1024/256) on one engine,
each with its step timeline, plus the copy bandwidth and matmul rate the
timelines' rooflines use; with ``--peers``, the decode step alone and HF
transformers' continuous batching on the same prompts. GPU machine, repo
root, the embedded tokenizer saved in .tok (carried):

    export PYTHONPATH=$PWD
    python3 benchmarks/engine_speed.py --out $OUT --peers [--only tp256-512,lat128] \
        [--engine num_scheduler_steps=8 ...]

Writes ``summary.json`` (bench records, ready times, rooflines),
``<workload>.steps.jsonl`` timelines and, where matplotlib is installed,
their ``<workload>.png`` (`benchmarks/timeline_report.py DIR --png` draws
them again). Every workload runs on the same engine (max_model_len
2048, the engine's defaults otherwise), warmed up once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from hf_peer import prompts as peer_prompts
from run_stamp import run_stamp

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


def workload_seed(name: str) -> int:
    return list(WORKLOADS).index(name) + 1


def run_peers(out_dir: str) -> dict:
    """The same-run peers, each in its own process before the engine takes
    the GPU: the decode step alone (decode_step.py, S=256 L=1024) and HF
    transformers' continuous batching on tp256-512's prompts (hf_peer.py)."""
    here = os.path.dirname(os.path.abspath(__file__))
    peers = {}
    p = subprocess.run([sys.executable, os.path.join(here, "decode_step.py"),
                        "--out", out_dir, "--sizes", "256:1024,1:1024"],
                       capture_output=True, text=True)
    path = os.path.join(out_dir, "decode-step.json")
    peers["decode_step"] = (json.load(open(path)) if p.returncode == 0
                            and os.path.exists(path) else
                            {"rc": p.returncode, "tail": p.stderr[-2000:]})
    _, n, n_in, n_out = WORKLOADS["tp256-512"]
    p = subprocess.run([sys.executable, os.path.join(here, "hf_peer.py"),
                        "--num-prompts", str(n), "--input-len", str(n_in),
                        "--output-len", str(n_out),
                        "--seed", str(workload_seed("tp256-512"))],
                       capture_output=True, text=True)
    lines = p.stdout.strip().splitlines()
    peers["hf_tp256-512"] = (json.loads(lines[-1]) if p.returncode == 0 and lines
                             else {"rc": p.returncode, "tail": p.stderr[-2000:]})
    return peers


def measure_roofline() -> dict:
    """The roofline's ceilings (docs/benchmarking.md): torch copy_ of 2 GiB (bytes read + written)
    and an 8192^3 bf16 matmul, and the same matmul in fp8 (``_scaled_mm``),
    medians of events-timed repeats."""
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
    out = dict(bw=2 * x.numel() * 2 / t_copy, flops=2 * 8192**3 / t_mm,
               device=torch.cuda.get_device_name())
    fa = fb = None
    try:  # the fp8 tensor cores' rate, for fp8 weights' products
        fa = a.to(torch.float8_e4m3fn)
        fb = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device="cuda")
        t_fp8 = timed(lambda: torch._scaled_mm(fa, fb, one, one,
                                               out_dtype=torch.bfloat16))
        out["flops_fp8"] = 2 * 8192**3 / t_fp8
    except (RuntimeError, AttributeError) as e:  # no fp8 tensor cores
        out["flops_fp8_error"] = repr(e)[:200]
    # The engines run in child processes whose XLA allocator takes
    # gpu_memory_utilization of the card: give torch's cached blocks back.
    x = y = a = b = fa = fb = None  # the timed closures hold them
    torch.cuda.empty_cache()
    return out


def memory_record(llm) -> dict:
    """What the pool was sized against and what the built programs need:
    the device allocator's counters, the pool's pages, and each compiled
    step program's temporary bytes (XLA's memory_analysis), the largest
    first; the pool reserves a workspace estimate for the widest of them
    (jaxinfer/worker/kv_pool_size.py)."""
    import jax
    engine = llm.llm_engine
    stats = jax.local_devices()[0].memory_stats() or {}
    temps = []
    for key, program in engine.runner.programs.built.items():
        try:
            m = program.memory_analysis()
            temps.append((int(m.temp_size_in_bytes), str(key)[:160]))
        except Exception as e:  # a loaded program may lack it
            temps.append((-1, f"{str(key)[:120]}: {e!r}"[:200]))
    temps.sort(reverse=True)
    return {**{k: stats.get(k) for k in ("bytes_limit", "bytes_in_use",
                                         "peak_bytes_in_use")},
            "num_kv_pages": engine.runner.num_blocks,
            "page_bytes": engine.runner.page_bytes,
            "max_num_batched_tokens": engine.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": engine.scheduler_config.max_num_seqs,
            "program_temp_bytes": temps[:8]}


def engine_overrides(pairs: list[str]) -> dict:
    """``--engine KEY=VALUE`` pairs as EngineArgs fields (VALUE read as a
    Python literal where it is one: ``num_scheduler_steps=8``)."""
    import ast
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--engine wants KEY=VALUE, not {pair!r}")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def make_llm(tokenizer: str, cache_dir: str, overrides: dict | None = None):
    from jaxinfer import LLM
    return LLM(tokenizer=tokenizer, warmup=True,
               compilation_cache_dir=cache_dir, **{**ENGINE, **(overrides or {})})


def ready(tokenizer: str, cache_dir: str) -> None:
    """--ready: start an engine, print the seconds to ready as JSON."""
    t0 = time.perf_counter()
    llm = make_llm(tokenizer, cache_dir)
    e = llm.llm_engine
    ready_s = time.perf_counter() - t0
    # Greedy tokens from random weights: cold (compiled) and warm (loaded)
    # engines must agree.
    from jaxinfer import SamplingParams
    from jaxinfer.worker.executable_cache import programs_fingerprint
    out = llm.generate([{"prompt_token_ids": list(range(100, 164))}],
                       SamplingParams(temperature=0.0, max_tokens=16,
                                      ignore_eos=True), use_tqdm=False)
    print(json.dumps({"ready_s": ready_s,
                      "greedy_tokens": out[0].outputs[0].token_ids,
                      "warmup_s": e.warmup_seconds,
                      "programs": e.warmup_programs,
                      "programs_loaded": e.runner.programs.num_loaded,
                      # What a warm start must match to load the saved programs.
                      "num_blocks": e.runner.num_blocks,
                      "fingerprint": programs_fingerprint(e.runner.programs,
                                                         e.runner.device_state())}))


def run_workload(llm, name: str, out_dir: str) -> dict:
    import numpy as np

    from jaxinfer import SamplingParams
    from jaxinfer.engine.step_timeline import StepTimeline
    kind, n, n_in, n_out = WORKLOADS[name]
    engine = llm.llm_engine
    # Fresh prompts per workload and an empty prefix cache: no workload
    # reuses another's prompts (vLLM's random prompts share nothing).
    seed = workload_seed(name)
    rng = np.random.default_rng(seed)
    engine.reset_prefix_cache()
    vocab = engine.model_config.vocab_size
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=n_out,
                        ignore_eos=True, detokenize=False)

    def prompts(k):
        if kind == "throughput":  # the same prompts as hf_peer.py's
            return [{"prompt_token_ids": p}
                    for p in peer_prompts(seed, k, n_in, vocab)]
        return [{"prompt_token_ids": rng.integers(100, vocab, n_in).tolist()}
                for _ in range(k)]
    if kind == "latency":  # one untimed batch, then the timed ones
        llm.generate(prompts(n), sp, use_tqdm=False)
    engine.timeline = StepTimeline(os.path.join(out_dir, f"{name}.steps.jsonl"))
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
    ap.add_argument("--model", default=ENGINE["model"],
                    help="a model folder (config.json; dummy weights)")
    ap.add_argument("--tokenizer", default=".tok")
    ap.add_argument("--cache-dir", default="/tmp/jaxinfer-xla-cache")
    ap.add_argument("--ready", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip-ready", action="store_true")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine setting over ENGINE's, for the workloads' "
                         "engine (not the ready runs); repeatable")
    ap.add_argument("--peers", action="store_true",
                    help="also the decode step alone and HF transformers' "
                         "continuous batching (tp256-512's prompts)")
    args = ap.parse_args()
    ENGINE["model"] = args.model
    if args.ready:
        ready(args.tokenizer, args.cache_dir)
        return 0
    os.makedirs(args.out, exist_ok=True)
    summary = {**run_stamp(),  # commit, and the digest of the tree that ran
               "engine": {**ENGINE, **engine_overrides(args.engine)}, "runs": {}}
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
                                "--model", args.model,
                                "--cache-dir", args.cache_dir],
                               capture_output=True, text=True)
            lines = p.stdout.strip().splitlines()
            summary[f"ready_{which}"] = (json.loads(lines[-1]) if p.returncode == 0
                                         else {"rc": p.returncode})
            # Warnings say why a warm start compiled instead of loading.
            summary[f"ready_{which}"]["stderr_tail"] = p.stderr[-3000:]
            summary[f"ready_{which}"]["process_s"] = time.perf_counter() - t0
            print(f"ready {which}: {summary[f'ready_{which}']}", flush=True)
            save()
        cold, warm = (summary[f"ready_{w}"].get("greedy_tokens") for w in ("cold", "warm"))
        summary["ready_same_tokens"] = cold is not None and cold == warm
        print(f"cold and warm engines' greedy tokens equal: "
              f"{summary['ready_same_tokens']}", flush=True)
    if args.peers:
        summary["peers"] = run_peers(args.out)
        print(f"peers: {json.dumps(summary['peers'])[:600]}", flush=True)
        save()
    t0 = time.perf_counter()
    llm = make_llm(args.tokenizer, args.cache_dir, engine_overrides(args.engine))
    summary["ready_in_process_s"] = time.perf_counter() - t0
    summary["memory"] = {"after_warmup": memory_record(llm)}
    # Saved before the workloads: a run cut off by a time limit still says
    # how long the engine took to build and what it holds.
    print(f"engine ready in {summary['ready_in_process_s']:.0f} s "
          f"({llm.llm_engine.warmup_programs} programs, "
          f"{llm.llm_engine.runner.num_blocks} pages)", flush=True)
    save()
    from jaxinfer.entrypoints.heap import startup_heap_frozen
    for name in args.only.split(","):
        with startup_heap_frozen():  # as `jaxinfer bench` runs its workloads
            rec = run_workload(llm, name, args.out)
        summary["runs"][name] = {"rc": 0, "bench": rec}
        print(f"[{name}] {json.dumps(rec)[:300]}", flush=True)
        hf = summary.get("peers", {}).get(f"hf_{name}", {})
        if "output_tokens_per_s" in hf:
            rec["vs_hf"] = rec["output_tokens_per_s"] / hf["output_tokens_per_s"]
        save()
    summary["memory"]["after_runs"] = memory_record(llm)
    save()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timeline_report import report_dir
    try:  # the timeline PNGs too, where matplotlib is there (the GPU machine)
        import matplotlib  # noqa: F401 - only whether it imports
        png = True
    except ImportError:
        png = False
    print(report_dir(args.out, summary, png=png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
