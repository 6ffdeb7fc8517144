"""Which stage bounds the Mosaic int4 kernel at one row (NOTES.md int4 v7):
the default kernel against itself with one stage left out (the tuning's
measurement-only ``probe``: no math, no loads after the ring's first fill,
a constant tile for the dequantized weights), and the per-program fixed
cost from one-wave launches (``splits=1``, 112 programs) over 16, 32 and
64 groups. GPU machine, repo root:

    PYTHONPATH=. python3 benchmarks/kernels/int4_stage_probe.py --out $OUT

Each timing chains 8 layers of distinct weights in one program, as
bench_int4.py does, and reports microseconds per layer and the fraction of
the copy bandwidth measured in the same run. Writes int4-stage-probe.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

from benchmarks.kernels.bench_attention import roofline
from benchmarks.kernels.bench_int4 import LAYERS, chain, per_layer_us, weights
from benchmarks.run_stamp import run_stamp
from jaxinfer.pallas_kernels.int4_matmul_mgpu import Int4MosaicTuning, int4_matmul_mgpu, plan

CASES = [
    # (name, In, Out, tuning)
    ("gate/up", 4096, 14336, Int4MosaicTuning()),
    ("gate/up", 4096, 14336, Int4MosaicTuning(probe="no_math")),
    ("gate/up", 4096, 14336, Int4MosaicTuning(probe="no_loads")),
    ("gate/up", 4096, 14336, Int4MosaicTuning(probe="no_dequant")),
    ("down", 14336, 4096, Int4MosaicTuning()),
    ("down", 14336, 4096, Int4MosaicTuning(probe="no_math")),
    ("down", 14336, 4096, Int4MosaicTuning(probe="no_loads")),
    ("down", 14336, 4096, Int4MosaicTuning(probe="no_dequant")),
    ("16 groups", 2048, 14336, Int4MosaicTuning(splits=1)),
    ("32 groups", 4096, 14336, Int4MosaicTuning(splits=1)),
    ("64 groups", 8192, 14336, Int4MosaicTuning(splits=1)),
    ("64 groups", 8192, 14336, Int4MosaicTuning(splits=1, probe="no_math")),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    roof = roofline()
    rows = []
    for name, n_in, n_out, t in CASES:
        q, s, z = weights(n_in, n_out, jax.random.key(n_in + n_out))
        x = jax.random.normal(jax.random.key(3), (1, n_in), jnp.bfloat16)
        fn = lambda x, q, s, z, t=t: int4_matmul_mgpu(x, q, s, z, tuning=t)
        ts = per_layer_us(chain(fn), x, q, s, z)
        us = statistics.median(ts)
        nbytes = q[0].nbytes + s[0].nbytes + z[0].nbytes
        p = plan(1, n_out, n_in // 128, t)
        row = dict(shape=name, In=n_in, Out=n_out, probe=t.probe or "none",
                   tuning=dataclasses.asdict(t), plan=p._asdict(), us=us,
                   repeats_us=ts, bytes=nbytes,
                   copy_bw_fraction=nbytes / (us * 1e-6) / roof["bw"])
        rows.append(row)
        print(f"{name:10s} {t.probe or 'none':10s} splits={p.splits} "
              f"gps={p.groups_per_split} {us:7.1f} us "
              f"{row['copy_bw_fraction']:.2f} of copy", flush=True)
    out = dict(run_stamp(), workload="int4 kernel stages, one row, "
               f"{LAYERS} layers chained", bw_bytes_per_s=roof["bw"],
               rows=rows)
    with open(os.path.join(args.out, "int4-stage-probe.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
