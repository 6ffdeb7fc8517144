"""The jitted sampler alone at S=256, V=128256 (the target: with every
feature on it costs <= 10% of a llama3-8b decode step at S=256).

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/sampler_bench.py --out $OUT [--step-ms 13.5]

Times, on random (not zero) float32 logits, medians of repeats after
warm-up: greedy only; temperature only; every feature (temperature, top-k,
top-p, min-p, allowed ids, banned ids, logit bias, repetition / frequency /
presence penalties with the on-device count update, top-20 logprobs). The
ratio is taken against ``--step-ms`` (a decode step measured by
benchmarks/decode_step.py in the same call; default: the docs/benchmarking.md
roofline of 13.5 ms at S=256, L=1024, which makes the ratio an upper bound).

BENCH_SMOKE=1 runs a small shape on CPU to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.kernels.bench_attention import time_fn
from jaxinfer.worker.penalties import PenaltyParams, PenaltyState, update_penalty_state
from jaxinfer.worker.sampler import (
    SamplingMetadata,
    _temperature_and_min_p,
    _threshold_from_candidates,
    process_logits,
    sample,
)
from jaxinfer.worker.top_candidates import BLOCK_SIZE, KEPT_BLOCKS

SMOKE = os.environ.get("BENCH_SMOKE") == "1"


def _step(logits, md, state, num_logprobs):
    if md.penalties is not None:
        state = update_penalty_state(state, md.penalties)
    out = sample(logits, md, state, num_logprobs)
    return out, state


def metadata(S, V, rng, every_feature: bool) -> SamplingMetadata:
    kw = dict(temperature=rng.uniform(0.5, 1.5, S).astype(np.float32),
              seeds=rng.integers(0, 2**32, S, dtype=np.uint32),
              positions=rng.integers(0, 1000, S).astype(np.int32))
    if not every_feature:
        return SamplingMetadata(**kw)
    rows = S + 1
    pad = lambda a: a.astype(np.int32)
    kw.update(
        top_k=rng.integers(1, 100, S).astype(np.int32),
        top_p=rng.uniform(0.5, 1.0, S).astype(np.float32),
        min_p=rng.uniform(0.0, 0.1, S).astype(np.float32),
        # Allowed ids, bans and grammars travel as one packed mask.
        token_bitmask=rng.integers(-2**31, 2**31 - 1, (S, (V + 31) // 32),
                                   dtype=np.int64).astype(np.int32),
        bias_ids=pad(rng.integers(0, V, (S, 16))),
        bias_values=rng.normal(0, 2, (S, 16)).astype(np.float32),
        penalties=PenaltyParams(
            slots=np.arange(S, dtype=np.int32),
            presence=rng.uniform(0, 1, S).astype(np.float32),
            frequency=rng.uniform(0, 1, S).astype(np.float32),
            repetition=rng.uniform(1, 1.5, S).astype(np.float32),
            reset_slots=np.full(S, rows - 1, np.int32),
            count_ids=pad(rng.integers(0, V, S)),  # one decode token each
            count_slots=np.arange(S, dtype=np.int32),
            count_is_output=np.ones(S, np.bool_)))
    return SamplingMetadata(**kw)


@jax.jit
def decided(logits, md, state):
    """Fraction of sampled rows whose top-k/top-p the candidates decide."""
    x = _temperature_and_min_p(process_logits(logits, md, state), md)
    _, exact = _threshold_from_candidates(x, md, KEPT_BLOCKS, BLOCK_SIZE)
    return jnp.mean(exact.astype(jnp.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--step-ms", type=float, default=13.5,
                    help="decode step time (ms) to compare with")
    ap.add_argument("--seqs", type=int, default=8 if SMOKE else 256)
    ap.add_argument("--vocab", type=int, default=1024 if SMOKE else 128256)
    ap.add_argument("--max-logprobs", type=int, default=20)
    args = ap.parse_args()
    S, V = args.seqs, args.vocab
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(0, 4, (S, V)).astype(np.float32))
    counts = rng.integers(0, 3, (S + 1, V)).astype(np.int32)
    counts[rng.random((S + 1, V)) < 0.98] = 0  # a few hundred seen tokens
    state = PenaltyState(jnp.asarray(counts),
                         jnp.asarray(rng.random((S + 1, V)) < 0.002))
    step = jax.jit(_step, static_argnums=(3,))
    every = metadata(S, V, rng, True)
    cases = {
        "greedy": (SamplingMetadata(), None),
        "temperature": (metadata(S, V, rng, False), None),
        "every_feature": (every, args.max_logprobs),
        # top-p without top-k on these flat random rows reaches past the
        # candidates' head: the full-row sort runs (the slow path's cost).
        "top_p_only": (dataclasses.replace(
            metadata(S, V, rng, False), top_p=every.top_p), None),
    }
    results = {}
    for name, (md, k) in cases.items():
        md = jax.device_put(md)
        ts = time_fn(lambda lg, m, st: step(lg, m, st, k), logits, md, state)
        ms = statistics.median(ts) * 1e3
        results[name] = {"ms": ms, "fraction_of_step": ms / args.step_ms}
        if md.top_k is not None or md.top_p is not None:
            results[name]["rows_decided_by_candidates"] = float(decided(logits, md,
                                                                        state))
        print(f"{name:14s} {ms:8.3f} ms  ({100 * ms / args.step_ms:.1f}% of a "
              f"{args.step_ms} ms step) {results[name].get('rows_decided_by_candidates', '')}")
    record = {
        "workload": "sampler", "S": S, "V": V,
        "max_logprobs": args.max_logprobs, "step_ms": args.step_ms,
        "device": jax.devices()[0].device_kind, "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "smoke": SMOKE, "results": results,
        "target_met": results["every_feature"]["fraction_of_step"] <= 0.10,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sampler_bench.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print("wrote", path)


if __name__ == "__main__":
    main()
