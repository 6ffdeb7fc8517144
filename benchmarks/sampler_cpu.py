"""The sampler's top-k / top-p filter on CPU: each way of finding the
threshold, on the embedded model's vocabulary.

One command (this machine, repo root):

    PYTHONPATH=$PWD python benchmarks/sampler_cpu.py --out benchmarks/results

Times ``filter_logits`` on [S, 49152] float32 logits (S = 16, 64) with
the candidates as sorted blocks (the GPU's form: 128 blocks of 64, 8192
entries sorted), as XLA's TopK of 128 entries (the CPU form), and the
whole-row bisection alone (the fallback either form takes when its head
cannot decide); plus ``sample`` whole. Rows: top-k 4 and 50, top-p 0.9
alone (on peaked logits its cut falls in the head; on flat ones it does
not), top-k 50 with top-p 0.9. Medians of 10 calls after one warm-up.
Writes sampler-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_stamp import run_stamp

from jaxinfer.worker.sampler import (
    SamplingMetadata,
    _filter_by_bisection,
    filter_logits,
    sample,
)

V = 49152
CASES = {"top_k=4": (4, 1.0), "top_k=50": (50, 1.0), "top_p=0.9": (0, 0.9),
         "top_k=50,top_p=0.9": (50, 0.9)}
LOGITS = {"peaked": 3.0, "flat": 0.3}  # standard deviation of the logits


def median_ms(f, *args) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    forms = {
        "blocks": jax.jit(lambda x, md: filter_logits(x, md, by_top_k=False)),
        "top_k": jax.jit(lambda x, md: filter_logits(x, md, by_top_k=True)),
        "bisection": jax.jit(_filter_by_bisection),
        "sample": jax.jit(lambda x, md: sample(x, md).token_ids),
    }
    rng = np.random.default_rng(0)
    rows = []
    for s in (16, 64):
        for shape, std in LOGITS.items():
            x = jnp.asarray(rng.standard_normal((s, V)).astype(np.float32) * std)
            for case, (k, p) in CASES.items():
                md = SamplingMetadata(
                    temperature=jnp.ones(s), seeds=jnp.arange(s, dtype=jnp.uint32),
                    positions=jnp.zeros(s, jnp.int32),
                    top_k=jnp.full(s, k, jnp.int32),
                    top_p=jnp.full(s, p, jnp.float32), min_p=jnp.zeros(s))
                row = {"S": s, "logits": shape, "case": case}
                row.update({f"{name}_ms": median_ms(f, x, md)
                            for name, f in forms.items()})
                rows.append(row)
                print(row, flush=True)
    out = {**run_stamp(), "device": jax.devices()[0].device_kind,
           "cpu_count": os.cpu_count(), "vocab": V,
           "command": "PYTHONPATH=$PWD python benchmarks/sampler_cpu.py "
                      "--out benchmarks/results", "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sampler-cpu.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{'S':>3} {'logits':7} {'case':20} {'blocks':>8} {'top_k':>8} "
          f"{'bisect':>8} {'sample':>8}")
    for r in rows:
        print(f"{r['S']:3d} {r['logits']:7} {r['case']:20} {r['blocks_ms']:8.2f} "
              f"{r['top_k_ms']:8.2f} {r['bisection_ms']:8.2f} {r['sample_ms']:8.2f}")


if __name__ == "__main__":
    main()
