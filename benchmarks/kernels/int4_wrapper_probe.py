"""How much of the int4 matmul's decode time is its XLA wrapper (padding,
the even/odd split, the per-group sums, the scale transposes, the split-K
sum) rather than the Pallas kernel: the full ``int4_matmul`` against
``partials_call`` (the ``pallas_call`` alone) on inputs prepared outside
the timed program, at one row, llama3-8b's four projection shapes, 8
layers of distinct weights per program, beside XLA's bf16 dot. GPU machine, repo root:

    PYTHONPATH=$PWD python3 benchmarks/kernels/int4_wrapper_probe.py --out $OUT

Writes int4-wrapper-probe.json to --out; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

from benchmarks.kernels.bench_attention import roofline
from benchmarks.kernels.bench_int4 import LAYERS, SHAPES, chain, per_layer_us, weights
from benchmarks.run_stamp import run_stamp
from jaxinfer.pallas_kernels import int4_matmul as im


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    roof = roofline()
    interpret = jax.default_backend() == "cpu"
    rows = []
    for name, n_in, n_out in SHAPES:
        key = jax.random.key(n_in + n_out)
        q, s, z = weights(n_in, n_out, key)
        G = s.shape[-1]
        t = im.default_tuning(1, n_out, G)
        x = jax.random.normal(jax.random.key(1), (1, n_in), jnp.bfloat16)
        full = per_layer_us(chain(lambda x, q, s, z: im.int4_matmul(
            x, q, s, z, tuning=t, interpret=interpret)), x, q, s, z)
        # The kernel alone: inputs split, summed and transposed beforehand.
        xp = jnp.pad(x, ((0, t.block_m - 1), (0, 0)))
        xe, xo = xp[:, 0::2], xp[:, 1::2]
        xsum = (xe.astype(jnp.float32) + xo.astype(jnp.float32)).reshape(
            t.block_m, G, -1).sum(-1)
        st, zt = jnp.swapaxes(s, 1, 2), jnp.swapaxes(z, 1, 2)

        def kernel_only(xe, xo, xsum, q, st, zt):
            out = 0
            for i in range(LAYERS):
                out = out + im.partials_call(xe, xo, xsum, q[i], st[i], zt[i], t,
                                             interpret)[0, 0, 0]
            return out
        alone = per_layer_us(jax.jit(kernel_only), xe, xo, xsum, q, st, zt)
        w16 = jax.random.normal(key, (LAYERS, n_in, n_out), jnp.bfloat16)
        bf16 = per_layer_us(chain(lambda x, w: x @ w), x, w16)
        del w16
        int4_bytes = q[0].size + s[0].size * 2 + z[0].size
        row = dict(shape=name, In=n_in, Out=n_out, tuning=str(t),
                   int4_matmul_us=statistics.median(full),
                   kernel_alone_us=statistics.median(alone),
                   bf16_dot_us=statistics.median(bf16),
                   copy_us=int4_bytes / roof["bw"] * 1e6)
        row["wrapper_share"] = 1 - row["kernel_alone_us"] / row["int4_matmul_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = dict(workload="int4-wrapper-probe", **run_stamp(), roofline=roof,
               rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "int4-wrapper-probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{'shape':8} {'full':>8} {'kernel':>8} {'bf16':>8} {'copy':>8}  us/layer")
    for r in rows:
        print(f"{r['shape']:8} {r['int4_matmul_us']:8.1f} {r['kernel_alone_us']:8.1f}"
              f" {r['bf16_dot_us']:8.1f} {r['copy_us']:8.1f}")


if __name__ == "__main__":
    main()
