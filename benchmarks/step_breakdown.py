"""Where one decode step's device time goes: the engine's own jitted step
(decode_step.py's, llama3-8b shape, random weights and KV) under the JAX
profiler, its GPU kernels grouped into matmuls, attention, other fusions
and copies, the idle time between kernels, and each group against its own
ceiling (matmuls: max(weight bytes / BW, FLOPs / matmul rate); attention:
KV bytes / BW). Also: the same step under other XLA command-buffer settings
(CUDA graphs, which shrink the gaps between kernels), and q/k/v and
gate/up as one matmul each against separate ones (would fusing the
projections pay?). GPU machine, repo root:

    export PYTHONPATH=$PWD
    python3 benchmarks/step_breakdown.py --out $OUT

Writes ``step-breakdown.json``: per (S, L) and XLA-flag variant the median
step time (no profiler), the kernel groups (profiled), the top kernels by
time, and the projection comparison. BENCH_SMOKE=1 runs a tiny shape on
CPU to check the script (CPU has no GPU kernels to group).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

SMOKE = os.environ.get("BENCH_SMOKE") == "1"

# XLA flag variants, each run in its own process (XLA reads the flags once).
VARIANTS = {
    "default": "",
    "no_command_buffer": "--xla_gpu_enable_command_buffer=",
    "graphs_min1": "--xla_gpu_graph_min_graph_size=1",
    # Every matmul through cuBLAS: XLA's Triton GEMM fusions (q/k/v merged
    # with the RMSNorm scale as a prologue, the GEMVs at S=1) off.
    "no_triton_gemm": "--xla_gpu_enable_triton_gemm=false",
}

# Kernel name -> group. cuBLAS/cuBLASLt Hopper GEMMs are "nvjet_*",
# "sm90_xmma_*", "cutlass*"; XLA's Triton GEMM fusions carry "gemm" or
# "dot"; our Pallas kernels carry their function names.
GROUPS = (
    # The Mosaic int4 kernel is a matmul (before "mosaic" below).
    ("matmul", re.compile(r"int4_matmul", re.I)),
    ("attention", re.compile(r"attention|paged|mosaic|ragged", re.I)),
    ("matmul", re.compile(r"nvjet|gemm|xmma|cutlass|cublas|dot|matmul|gemv", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
    ("sort_topk", re.compile(r"sort|topk|top_k|radix", re.I)),
)


def group_of(name: str) -> str:
    for g, rx in GROUPS:
        if rx.search(name):
            return g
    return "other_fusion"


def gpu_kernel_events(trace_dir: str) -> list[tuple[str, int, int]]:
    """(name, start_ns, end_ns) of every kernel on the GPU planes."""
    from jax.profiler import ProfileData
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"),
                      recursive=True)
    events = []
    for p in paths:
        pd = ProfileData.from_file(p)
        for plane in pd.planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                # Stream lines hold the kernels; "XLA Ops"/"XLA Modules"
                # lines repeat them as HLO names, so skip those.
                if "stream" not in line.name.lower():
                    continue
                for e in line.events:
                    events.append((e.name, int(e.start_ns), int(e.end_ns)))
    return sorted(events, key=lambda e: e[1])


def profile_steps(run, steps: int) -> dict:
    """Kernel groups and idle time over ``steps`` back-to-back steps."""
    import jax
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        for _ in range(steps):
            out = run()
        jax.block_until_ready(out)
        jax.profiler.stop_trace()
        return summarize_trace(d, steps)


def summarize_trace(trace_dir: str, steps: int) -> dict:
    """Per step: kernel groups, busy time (the union of kernel intervals)
    and idle time between the first kernel and the last."""
    ev = gpu_kernel_events(trace_dir)
    if not ev:
        return {"kernels": 0}
    span = ev[-1][2] - ev[0][1]
    busy = 0
    end = ev[0][1]
    for _, s, e in ev:  # union of kernel intervals (streams may overlap)
        if e > end:
            busy += e - max(s, end)
            end = e
    groups: dict[str, dict] = {}
    names: dict[str, list] = {}
    for n, s, e in ev:
        g = groups.setdefault(group_of(n), {"n": 0, "ms": 0.0})
        g["n"] += 1
        g["ms"] += (e - s) / 1e6
        names.setdefault(n, [0, 0.0])
        names[n][0] += 1
        names[n][1] += (e - s) / 1e6
    for g in groups.values():
        g["n"] /= steps
        g["ms"] /= steps
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:25]
    return dict(kernels=len(ev) / steps, span_ms=span / 1e6 / steps,
                busy_ms=busy / 1e6 / steps, idle_ms=(span - busy) / 1e6 / steps,
                groups=groups,
                top=[dict(name=n[:120], n=c / steps, ms=t / steps)
                     for n, (c, t) in top])


def step_rows(sizes, profile: bool, hlo_dir: str | None = None) -> list[dict]:
    """Time (and profile) the engine's decode step at each (S, L)."""
    from benchmarks.decode_step import LLAMA3_8B, TINY, build, step_caller
    from benchmarks.kernels.bench_attention import time_fn
    cfg = TINY if SMOKE else LLAMA3_8B
    backend = "pallas_interpret" if SMOKE else "pallas"
    _, params, constants, step = build(cfg, backend, max(L for _, L in sizes))
    rows = []
    for S, L in sizes:
        run, state, (ids, pos, md) = step_caller(step, params, constants, cfg, S, L)
        ts = time_fn(run, repeats=7, min_s=0.05)
        row = dict(S=S, L=L, ms=statistics.median(ts) * 1e3, repeats_s=ts)
        if hlo_dir:  # XLA's optimized program: which op each kernel is
            text = step.lower(params, state["kv"], constants, ids, pos,
                              md).compile().as_text()
            with open(os.path.join(hlo_dir, f"hlo-S{S}-L{L}.txt"), "w") as f:
                f.write(text)
        if profile:
            row["profile"] = profile_steps(run, steps=5)
        rows.append(row)
        del state
    return rows


def projections(roof: dict) -> list[dict]:
    """q/k/v and gate/up: separate matmuls against one matmul of the
    concatenated weights, 32 weight sets (a layer each, so nothing stays
    in L2), at the batch sizes a decode and a prefill step have."""
    import jax
    import jax.numpy as jnp

    from benchmarks.kernels.bench_attention import time_fn
    D, Q, KV, F, layers = 4096, 4096, 1024, 14336, 32
    if SMOKE:
        D, Q, KV, F, layers = 64, 64, 16, 128, 2
    key = jax.random.key(0)
    out = []
    for name, widths in (("qkv", (Q, KV, KV)), ("gate_up", (F, F))):
        ws = [jax.random.normal(jax.random.fold_in(key, i), (layers, D, w),
                                jnp.bfloat16) for i, w in enumerate(widths)]
        fused = jnp.concatenate(ws, axis=-1)

        def combine(acc, ys):
            # Every output feeds the next layer's input (nothing is dead
            # code), the same elementwise work for both variants.
            mix = ys[0][:, :D]
            for y in ys[1:]:
                mix = mix + y[:, :1]
            return acc + mix * 1e-3

        @jax.jit
        def separate(x, ws):
            acc = x
            for i in range(layers):
                acc = combine(acc, [acc @ w[i] for w in ws])
            return acc

        cuts = [sum(widths[:k]) for k in range(1, len(widths))]

        @jax.jit
        def one(x, w):
            acc = x
            for i in range(layers):
                acc = combine(acc, jnp.split(acc @ w[i], cuts, axis=-1))
            return acc
        for S in (1, 64, 256, 2048):
            x = jax.random.normal(key, (S, D), jnp.bfloat16)
            t_sep = statistics.median(time_fn(separate, x, ws)) / layers
            t_one = statistics.median(time_fn(one, x, fused)) / layers
            nbytes = D * sum(widths) * 2
            flops = 2 * S * D * sum(widths)
            t_min = max(nbytes / roof["bw"], flops / roof["flops"])
            out.append(dict(proj=name, S=S, separate_us=t_sep * 1e6,
                            fused_us=t_one * 1e6, t_min_us=t_min * 1e6,
                            speedup=t_sep / t_one))
        del ws, fused
    return out


def child(variant: str, sizes, out_path: str, hlo_dir: str | None) -> None:
    if variant == "projections":
        from benchmarks.kernels.bench_attention import roofline
        with open(out_path, "w") as f:
            json.dump(dict(variant=variant, rows=projections(roofline())), f)
        return
    rows = step_rows(sizes, profile=True, hlo_dir=hlo_dir)
    with open(out_path, "w") as f:
        json.dump(dict(variant=variant, rows=rows), f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--sizes", default="1:1024,64:1024,256:1024,256:1536")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-projections", action="store_true",
                    help="skip the fused-vs-separate projection timings")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="only summarize an existing profiler trace (e.g. "
                         "`jaxinfer bench latency --profile-trace DIR`) "
                         "of --steps steps, and print it as JSON")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--hlo", action="store_true",
                    help="also write each step's optimized HLO (default variant)")
    args = ap.parse_args()
    sizes = [tuple(map(int, s.split(":"))) for s in args.sizes.split(",")]
    if SMOKE:
        sizes = [(2, 64)]
    if args.trace:
        print(json.dumps(summarize_trace(args.trace, args.steps)))
        return 0
    if args.child is not None:
        child(args.child, sizes, args.child_out,
              args.out if args.hlo and args.child == "default" else None)
        return 0
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from benchmarks.kernels.bench_attention import roofline
    roof = roofline()
    import jax
    result = dict(
        workload="step-breakdown", model="tiny" if SMOKE else "llama3-8b",
        date=datetime.datetime.now(datetime.UTC).isoformat(),
        commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip(),
        device=roof["device"], jax=jax.__version__,
        bw_bytes_per_s=roof["bw"], matmul_flops_per_s=roof["flops"],
        variants={})
    os.makedirs(args.out, exist_ok=True)
    # Each part in its own process, in order, the result saved after each:
    # a call cut short keeps what finished.
    parts = ([] if args.no_projections else ["projections"])
    for v in parts + args.variants.split(","):
        path = os.path.join(args.out, f"breakdown-{v}.json")
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                          " " + VARIANTS.get(v, "")).strip())
        p = subprocess.run([sys.executable, __file__, "--child", v,
                            "--child-out", path, "--sizes", args.sizes,
                            "--out", args.out] + (["--hlo"] if args.hlo else []),
                           env=env, capture_output=True, text=True)
        ok = p.returncode == 0 and os.path.exists(path)
        rows = (json.load(open(path))["rows"] if ok else
                {"rc": p.returncode, "tail": p.stderr[-3000:]})
        if ok:
            os.remove(path)
        if v == "projections":
            result["projections"] = rows if ok else []
            result["projections_error"] = None if ok else rows
        else:
            result["variants"][v] = rows
        print(f"part {v}: rc {p.returncode}", flush=True)
        with open(os.path.join(args.out, "step-breakdown.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(f"BW {roof['bw'] / 1e12:.2f} TB/s, matmul {roof['flops'] / 1e12:.0f} TFLOP/s")
    print("projections (us per layer):")
    for r in result.get("projections", []):
        print(f"  {r['proj']:>7} S={r['S']:>5} separate {r['separate_us']:8.1f} "
              f"fused {r['fused_us']:8.1f} t_min {r['t_min_us']:8.1f} "
              f"x{r['speedup']:.2f}")
    for v, rows in result["variants"].items():
        if not isinstance(rows, list):
            print(f"{v}: failed rc={rows['rc']} {rows['tail'][-300:]}")
            continue
        for r in rows:
            p = r.get("profile", {})
            g = {k: round(x["ms"], 2) for k, x in p.get("groups", {}).items()}
            print(f"{v:>18} S={r['S']:>4} L={r['L']:>5} {r['ms']:7.2f} ms | "
                  f"profiled span {p.get('span_ms', 0):6.2f} idle "
                  f"{p.get('idle_ms', 0):5.2f} kernels {p.get('kernels', 0):5.0f} {g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
