"""The int4 matmul kernels (pallas_kernels/int4_matmul.py: Triton;
int4_matmul_mgpu.py: Mosaic GPU) on one GPU at llama3-8b's layer shapes:
correctness, then timings against XLA's bf16 dot and XLA's own
dequantize-then-dot, with the copy bandwidth of the same run as the
roofline.

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/bench_int4.py --out $OUT [--budget-s 300]
        [--ms 1,256] [--triton-sweep]
    python3 benchmarks/kernels/bench_int4.py --lower-only   # on CPU

AWQ layout, groups of 128 inputs. Each timing runs 8 layers of distinct
weights in one program (more bytes than the 50 MB L2, one host dispatch) and
reports the median time per layer, the kernels' wrappers (padding, split
sums) included. First pass, every shape and row count: bf16 dot, the
Triton kernel at its default tuning, the Mosaic kernel at its default;
second pass, while the budget lasts: XLA's int4 product and Mosaic
variants (warpgroups, splits, stages, form). ``--triton-sweep`` runs the
Triton tuning sweep of the earlier sessions instead of its default alone:
stage 1 sweeps block_n x splits (decode) or block_m x block_n (M = 256) for
both ``scale_on`` forms; stage 2 varies warps and stages around the
decode's best. Prints a table last; writes int4-kernel.json to --out. (The
first sweep, int4-kernel-h200.json, also
tried fori_loop's unroll, which the Triton lowering refuses, and the run
in int4-kernel-gemv-h200.json a one-row gemv form, and the one in
int4-kernel-group-steps-h200.json several groups per loop step: both
dropped, each within 5% of the form kept; pallas_kernels/NOTES.md.)
BENCH_SMOKE=1 runs tiny shapes in interpret mode on CPU (checks the script).
``--lower-only`` (no GPU needed) exports every Mosaic tuning the run would
time for CUDA, which runs Mosaic's lowering of each: a pre-flight.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

from benchmarks.kernels.bench_attention import roofline, time_fn
from benchmarks.run_stamp import run_stamp
from jaxinfer.pallas_kernels.int4_matmul import (
    Int4MatmulTuning,
    default_tuning,
    int4_matmul,
    int4_matmul_reference,
)
from jaxinfer.pallas_kernels.int4_matmul_mgpu import Int4MosaicTuning, plan

SMOKE = os.environ.get("BENCH_SMOKE") == "1"
GROUP = 128
LAYERS = 2 if SMOKE else 8
# (name, In, Out) of llama3-8b's projections (k and v alike).
SHAPES = ([("tiny", 256, 128)] if SMOKE else
          [("gate/up", 4096, 14336), ("down", 14336, 4096),
           ("q/o", 4096, 4096), ("k/v", 4096, 1024)])
# M = 1 runs the same kernel as M = 16 (row blocks of 16): one is enough.
MS = [1, 64] if SMOKE else [1, 256]


def weights(n_in, n_out, key):
    k = jax.random.split(key, 3)
    G = n_in // GROUP
    q = jax.random.bits(k[0], (LAYERS, n_out, n_in // 2), jnp.uint8)
    s = (jax.random.uniform(k[1], (LAYERS, n_out, G)) * 0.01 + 1e-3).astype(
        jnp.float16)
    z = jax.random.bits(k[2], (LAYERS, n_out, G), jnp.uint8) & 0xF
    return q, s, z


def chain(fn):
    """One program: every layer's product of the same x, summed."""
    @jax.jit
    def run(x, *ws):
        out = 0
        for i in range(LAYERS):
            out = out + fn(x, *(w[i] for w in ws)).astype(jnp.float32)
        return out
    return run


def per_layer_us(fn, *args):
    return [t / LAYERS * 1e6 for t in time_fn(fn, *args, repeats=5)]


def sweep_tunings(M):
    if M <= 16:
        for scale_on, bn, splits in itertools.product(
                ("weights", "partials"), (64, 128, 256), (1, 2, 4, 8)):
            yield Int4MatmulTuning(block_m=16, block_n=bn, splits=splits,
                                   scale_on=scale_on, num_stages=3)
        return
    for scale_on, bm, bn in itertools.product(
            ("weights", "partials"), (64, 128), (64, 128, 256)):
        yield Int4MatmulTuning(block_m=bm, block_n=bn, splits=1,
                               scale_on=scale_on, num_stages=3)


def around(best):
    for warps, stages in itertools.product((4, 8), (2, 3, 4)):
        t = dataclasses.replace(best, num_warps=warps, num_stages=stages)
        if t != best:
            yield t


def mosaic_variants(M):
    """Mosaic tunings the second pass tries (the default is timed first)."""
    if M <= 16:
        yield from (Int4MosaicTuning(warpgroups=4),
                    Int4MosaicTuning(warpgroups=1),
                    Int4MosaicTuning(programs_per_sm=2),
                    Int4MosaicTuning(num_stages=4),
                    Int4MosaicTuning(scale_on="partials"),
                    Int4MosaicTuning(scale_on="weights"))
        return
    yield from (Int4MosaicTuning(warpgroups=4),
                Int4MosaicTuning(block_rows=64),
                Int4MosaicTuning(scale_on="weights", block_rows=64),
                Int4MosaicTuning(programs_per_sm=2))


def lower_only(ms):
    """Exports each Mosaic tuning for CUDA (Mosaic's lowering runs on CPU;
    ptxas does not): the errors a GPU call would hit first."""
    bad = 0
    for (name, n_in, n_out), M in itertools.product(SHAPES, ms):
        G = n_in // GROUP
        args = (jax.ShapeDtypeStruct((M, n_in), jnp.bfloat16),
                jax.ShapeDtypeStruct((n_out, n_in // 2), jnp.uint8),
                jax.ShapeDtypeStruct((n_out, G), jnp.float16),
                jax.ShapeDtypeStruct((n_out, G), jnp.uint8))
        for t in (Int4MosaicTuning(), *mosaic_variants(M)):
            fn = jax.jit(lambda *a, t=t: int4_matmul(*a, tuning=t))
            try:
                jax.export.export(fn, platforms=["cuda"])(*args)
                what = f"ok {plan(M, n_out, G, t)}"
            except Exception as e:
                bad += 1
                what = f"FAILED {repr(e)[:300]}"
            print(f"{name} M={M} {t}: {what}", flush=True)
    print(f"{bad} failed")


def kernel_name(t):
    return "mosaic" if isinstance(t, Int4MosaicTuning) else "triton"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--ms", default=",".join(map(str, MS)),
                    help="rows to time, comma-separated")
    ap.add_argument("--triton-sweep", action="store_true")
    ap.add_argument("--lower-only", action="store_true")
    ap.add_argument("--skip", default="",
                    help="comma-separated: triton, xla-int4 (a run that "
                    "times only the Mosaic kernel beside bf16)")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    if args.lower_only:
        return lower_only(ms)
    deadline = time.time() + args.budget_s
    roof = roofline()
    interpret = SMOKE
    rows, checks = [], []
    cases = {}

    def case(name, n_in, n_out, M):
        """Inputs of one (shape, rows) case, kept across the two passes."""
        if (name, M) not in cases:
            key = jax.random.key(n_in + n_out + M)
            q, s, z = weights(n_in, n_out, key)
            x = jax.random.normal(jax.random.key(M), (M, n_in), jnp.bfloat16)
            want = int4_matmul_reference(x, q[0], s[0], z[0]).astype(
                jnp.float32)
            base = dict(shape=name, In=n_in, Out=n_out, M=M,
                        int4_bytes=(q[0].size + s[0].size * 2 + z[0].size),
                        bf16_bytes=n_in * n_out * 2)
            cases[name, M] = dict(q=q, s=s, z=z, x=x, want=want, base=base,
                                  tried={})
        return cases[name, M]

    def try_tuning(c, t):
        tried, base = c["tried"], c["base"]
        if time.time() > deadline or t in tried:
            return
        fn = lambda x, q, s, z, t=t: int4_matmul(
            x, q, s, z, tuning=t, interpret=interpret)
        row = dict(base, variant="kernel", kernel=kernel_name(t),
                   tuning=dict(dataclasses.asdict(t), kind=kernel_name(t)))
        if isinstance(t, Int4MosaicTuning):
            row["plan"] = plan(base["M"], base["Out"], base["In"] // GROUP,
                               t)._asdict()
        try:
            got = jax.jit(fn)(c["x"], c["q"][0], c["s"][0], c["z"][0])
            got = got.astype(jnp.float32)
            want = c["want"]
            err = float(jnp.abs(got - want).max() / jnp.abs(want).max())
            ts = per_layer_us(chain(fn), c["x"], c["q"], c["s"], c["z"])
        except Exception as e:  # record it, try the next
            tried[t] = None
            rows.append(dict(row, error=repr(e)[:600]))
            print(f"{base['shape']} M={base['M']} {kernel_name(t)} failed: "
                  f"{repr(e)[:300]}", flush=True)
            return
        tried[t] = statistics.median(ts)
        rows.append(dict(row, rel_err=err, us=tried[t], repeats_us=ts))
        checks.append(err < 2e-2)
        print(f"{base['shape']} M={base['M']} {kernel_name(t)} "
              f"{tried[t]:.1f} us err {err:.1e}", flush=True)

    def xla(c, variant, fn, *args):
        if time.time() > deadline:
            return
        ts = per_layer_us(chain(fn), *args)
        rows.append(dict(c["base"], variant=variant,
                         us=statistics.median(ts), repeats_us=ts))

    # Pass 1: the comparison the targets name, at default tunings.
    for (name, n_in, n_out), M in itertools.product(SHAPES, ms):
        c = case(name, n_in, n_out, M)
        w16 = jax.random.normal(jax.random.key(1), (LAYERS, n_in, n_out),
                                jnp.bfloat16)
        xla(c, "bf16 xla dot", lambda x, w: x @ w, c["x"], w16)
        del w16
        if not SMOKE:  # Mosaic has no CPU path but its interpreter
            try_tuning(c, Int4MosaicTuning())
        if "triton" not in skip:
            try_tuning(c, default_tuning(M, n_out, n_in // GROUP))
    # Pass 2 (fewest rows first): Mosaic variants, the Triton sweep, then
    # XLA's int4 product.
    for M, (name, n_in, n_out) in itertools.product(ms, SHAPES):
        c = case(name, n_in, n_out, M)
        if not SMOKE:
            for t in mosaic_variants(M):
                try_tuning(c, t)
        if args.triton_sweep:
            for t in sweep_tunings(M):
                try_tuning(c, t)
            timed = {t: v for t, v in c["tried"].items()
                     if v is not None and kernel_name(t) == "triton"}
            if timed and M <= 16:
                for t in around(min(timed, key=timed.get)):
                    try_tuning(c, t)
    for M, (name, n_in, n_out) in itertools.product(ms, SHAPES):
        if "xla-int4" in skip:
            break
        c = case(name, n_in, n_out, M)
        xla(c, "int4 xla dequant+dot", int4_matmul_reference, c["x"], c["q"],
            c["s"], c["z"])
    for r in rows:
        if "us" in r:
            nbytes = r["bf16_bytes"] if r["variant"].startswith("bf16") \
                else r["int4_bytes"]
            r["copy_bw_fraction"] = nbytes / (r["us"] * 1e-6) / roof["bw"]
    out = dict(workload="int4-kernel", device=roof["device"],
               jax=jax.__version__, bw_bytes_per_s=roof["bw"],
               all_close=all(checks), group_size=GROUP, **run_stamp(),
               command="python3 benchmarks/kernels/bench_int4.py --out $OUT "
               f"--ms {args.ms}" + (" --triton-sweep" if args.triton_sweep
                                    else "")
               + (f" --skip {args.skip}" if args.skip else ""),
               rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "int4-kernel.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"copy {roof['bw'] / 1e12:.2f} TB/s; kernels within 2e-2 of the "
          f"reference: {all(checks)} ({len(checks)} timed)")
    print(f"{'shape':>8} {'M':>4} {'bf16 us':>8} {'triton':>8} "
          f"{'mosaic':>8} {'mos/bf16':>8} {'of copy':>8}  best mosaic")
    for (name, _, _), M in itertools.product(SHAPES, ms):
        mine = [r for r in rows if r["shape"] == name and r["M"] == M]
        get = {r["variant"]: r for r in mine if r["variant"] != "kernel"}
        best = {}
        for k in ("triton", "mosaic"):
            ks = [r for r in mine if r.get("kernel") == k and "us" in r]
            best[k] = min(ks, key=lambda r: r["us"]) if ks else None
        if "bf16 xla dot" not in get:
            continue
        bf = get["bf16 xla dot"]["us"]
        tr, mo = best["triton"], best["mosaic"]
        t = mo["tuning"] if mo else {}
        print(f"{name:>8} {M:>4} {bf:8.1f} "
              f"{tr['us'] if tr else float('nan'):8.1f} "
              f"{mo['us'] if mo else float('nan'):8.1f} "
              f"{bf / mo['us'] if mo else float('nan'):7.2f}x "
              f"{mo['copy_bw_fraction'] if mo else float('nan'):8.2f}  "
              + (f"wg{t['warpgroups']} st{t['num_stages']} "
                 f"sp{t['splits']}/{mo['plan']['splits']} "
                 f"n{mo['plan']['rows']} pps{t['programs_per_sm']} "
                 f"{'partials' if mo['plan']['partials'] else 'weights'}"
                 if mo else ""))


if __name__ == "__main__":
    main()
