"""Where the sampler's time goes at S=256, V=128256: each stage timed alone.

    export PYTHONPATH=$PWD
    python3 benchmarks/sampler_breakdown.py

Companion of sampler_bench.py (which times the whole sampler); random float32
logits, medians of repeats after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.kernels.bench_attention import time_fn
from benchmarks.sampler_bench import metadata
from jaxinfer.worker.logprob_ops import gather_logprobs, top_k_in_rounds
from jaxinfer.worker.penalties import PenaltyState
from jaxinfer.worker.sampler import (
    _draw,
    _filter_by_bisection,
    _filter_by_sorting_rows,
    _temperature_and_min_p,
    filter_logits,
    process_logits,
)
from jaxinfer.worker.top_candidates import top_candidates

SMOKE = os.environ.get("BENCH_SMOKE") == "1"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="folder for sampler_breakdown.json")
    args = ap.parse_args()
    S, V = (8, 1024) if SMOKE else (256, 128256)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(0, 4, (S, V)).astype(np.float32))
    md = jax.device_put(metadata(S, V, rng, True))
    counts = np.zeros((S + 1, V), np.int32)
    state = PenaltyState(jnp.asarray(counts), jnp.zeros((S + 1, V), bool))
    tok = jnp.zeros(S, jnp.int32)
    stages = {
        "process_logits": jax.jit(lambda x, md, st: process_logits(x, md, st)),
        "filter_logits": jax.jit(lambda x, md, st: filter_logits(x, md)),
        "filter_by_sorting_rows": jax.jit(lambda x, md, st: _filter_by_sorting_rows(
            _temperature_and_min_p(x, md), md)),
        "filter_by_bisection": jax.jit(lambda x, md, st: _filter_by_bisection(
            _temperature_and_min_p(x, md), md)),
        **{f"filter_kept{kb}_block{bs}": jax.jit(
            lambda x, md, st, kb=kb, bs=bs: filter_logits(
                x, md, kept_blocks=kb, block_size=bs))
           for kb, bs in ((64, 64), (128, 32), (256, 32), (128, 128))},
        "top_candidates_128x64": jax.jit(lambda x, md, st: top_candidates(x)),
        "top_k_in_rounds_20": jax.jit(lambda x, md, st: top_k_in_rounds(x, 20)),
        "sort_rows": jax.jit(lambda x, md, st: jnp.sort(x, axis=-1)),
        "cumsum_rows": jax.jit(lambda x, md, st: jnp.cumsum(x, axis=-1)),
        "softmax_rows": jax.jit(lambda x, md, st: jax.nn.softmax(x, axis=-1)),
        "top_k_20": jax.jit(lambda x, md, st: jax.lax.top_k(x, 20)),
        "top_k_16": jax.jit(lambda x, md, st: jax.lax.top_k(x, 16)),
        "gather_logprobs_20": jax.jit(lambda x, md, st: gather_logprobs(x, tok, 20)),
        "draw": jax.jit(lambda x, md, st: _draw(md.seeds, md.positions, x)),
    }
    print(f"S={S} V={V} device={jax.devices()[0].device_kind}")
    out = {}
    for name, fn in stages.items():
        ms = statistics.median(time_fn(fn, x, md, state)) * 1e3
        out[name] = round(ms, 4)
        print(f"{name:24s} {ms:8.3f} ms")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "sampler_breakdown.json"), "w") as f:
            json.dump({"S": S, "V": V, "device": jax.devices()[0].device_kind,
                       "jax": jax.__version__, "ms": out}, f, indent=2)


if __name__ == "__main__":
    main()
