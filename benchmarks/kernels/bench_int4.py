"""The int4 matmul kernel (pallas_kernels/int4_matmul.py) on one GPU at
llama3-8b's layer shapes: correctness, then a tuning sweep against XLA's
bf16 dot and XLA's own dequantize-then-dot, with the copy bandwidth of the
same run as the roofline.

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/bench_int4.py --out $OUT [--budget-s 300]

AWQ layout, groups of 128 inputs. Each timing runs 8 layers of distinct
weights in one program (more bytes than the 50 MB L2, one host dispatch) and
reports the median time per layer. Stage 1 sweeps block_n x splits (decode)
or block_m x block_n (M = 256) for both ``scale_on`` forms; stage 2 varies
warps and stages around the decode's best. Prints a table last; writes
int4-kernel.json to --out. (The first sweep, int4-kernel-h200.json, also
tried fori_loop's unroll, which the Triton lowering refuses, and the run
in int4-kernel-gemv-h200.json a one-row gemv form, and the one in
int4-kernel-group-steps-h200.json several groups per loop step: both
dropped, each within 5% of the form kept; pallas_kernels/NOTES.md.)
BENCH_SMOKE=1 runs tiny shapes in interpret mode on CPU (checks the script).
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

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels.bench_attention import roofline, time_fn  # noqa: E402
from benchmarks.run_stamp import run_stamp  # noqa: E402
from jaxinfer.pallas_kernels.int4_matmul import (  # noqa: E402
    Int4MatmulTuning, int4_matmul, int4_matmul_reference)

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--ms", default=",".join(map(str, MS)),
                    help="rows to time, comma-separated")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    deadline = time.time() + args.budget_s
    roof = roofline()
    interpret = SMOKE
    rows, checks = [], []
    for (name, n_in, n_out), M in itertools.product(SHAPES, ms):
        key = jax.random.key(n_in + n_out + M)
        q, s, z = weights(n_in, n_out, key)
        x = jax.random.normal(jax.random.key(M), (M, n_in), jnp.bfloat16)
        w16 = jax.random.normal(key, (LAYERS, n_in, n_out), jnp.bfloat16)
        int4_bytes = (q[0].size + s[0].size * 2 + z[0].size)
        base = dict(shape=name, In=n_in, Out=n_out, M=M,
                    int4_bytes=int4_bytes, bf16_bytes=n_in * n_out * 2)
        t_bf16 = per_layer_us(chain(lambda x, w: x @ w), x, w16)
        del w16
        t_xla = per_layer_us(chain(int4_matmul_reference), x, q, s, z)
        rows.append(dict(base, variant="bf16 xla dot",
                         us=statistics.median(t_bf16), repeats_us=t_bf16))
        rows.append(dict(base, variant="int4 xla dequant+dot",
                         us=statistics.median(t_xla), repeats_us=t_xla))
        want = int4_matmul_reference(x, q[0], s[0], z[0]).astype(jnp.float32)
        tried = {}

        def try_tuning(t):
            if time.time() > deadline or t in tried:
                return
            fn = lambda x, q, s, z, t=t: int4_matmul(  # noqa: E731
                x, q, s, z, tuning=t, interpret=interpret)
            try:
                got = fn(x, q[0], s[0], z[0]).astype(jnp.float32)
                err = float(jnp.abs(got - want).max()
                            / jnp.abs(want).max())
                ts = per_layer_us(chain(fn), x, q, s, z)
            except Exception as e:  # record it, try the next
                tried[t] = None
                rows.append(dict(base, variant="kernel",
                                 tuning=dataclasses.asdict(t),
                                 error=repr(e)[:400]))
                return
            tried[t] = statistics.median(ts)
            rows.append(dict(base, variant="kernel",
                             tuning=dataclasses.asdict(t), rel_err=err,
                             us=tried[t], repeats_us=ts))
            checks.append(err < 2e-2)

        for t in sweep_tunings(M):
            try_tuning(t)
        timed = {t: v for t, v in tried.items() if v is not None}
        if timed and M <= 16:  # decode: the case the targets name
            for t in around(min(timed, key=timed.get)):
                try_tuning(t)
    for r in rows:
        if "us" in r:
            nbytes = r["bf16_bytes"] if r["variant"].startswith("bf16") \
                else r["int4_bytes"]
            r["copy_bw_fraction"] = nbytes / (r["us"] * 1e-6) / roof["bw"]
    out = dict(workload="int4-kernel", device=roof["device"],
               jax=jax.__version__, bw_bytes_per_s=roof["bw"],
               all_close=all(checks), group_size=GROUP, **run_stamp(),
               command="python3 benchmarks/kernels/bench_int4.py --out $OUT "
               f"--ms {args.ms}",
               rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "int4-kernel.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"copy {roof['bw'] / 1e12:.2f} TB/s; kernels within 2e-2 of the "
          f"reference: {all(checks)} ({len(checks)} tunings)")
    print(f"{'shape':>8} {'M':>4} {'bf16 us':>8} {'xla int4':>9} "
          f"{'kernel':>8} {'vs bf16':>8} {'of copy':>8}  best tuning")
    for (name, _, _), M in itertools.product(SHAPES, ms):
        mine = [r for r in rows if r["shape"] == name and r["M"] == M]
        get = {r["variant"]: r for r in mine if r["variant"] != "kernel"}
        ks = [r for r in mine if r["variant"] == "kernel" and "us" in r]
        if not ks or "bf16 xla dot" not in get:
            continue
        b = min(ks, key=lambda r: r["us"])
        bf = get["bf16 xla dot"]["us"]
        t = b["tuning"]
        print(f"{name:>8} {M:>4} {bf:8.1f} "
              f"{get['int4 xla dequant+dot']['us']:9.1f} {b['us']:8.1f} "
              f"{bf / b['us']:7.2f}x {b['copy_bw_fraction']:8.2f}  "
              f"bm{t['block_m']} bn{t['block_n']} s{t['splits']} "
              f"w{t['num_warps']} st{t['num_stages']} {t['scale_on']}")


if __name__ == "__main__":
    main()
