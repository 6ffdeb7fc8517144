"""Multi-step decode (``num_scheduler_steps``): the engine's decode step at
batch 1 (and S=64) through the engine's own `ModelRunner`, one program per
token against one program per window of k tokens, the steps dispatched as
the engine overlaps them (step N+1 enqueued before N's tokens are read).
The per-token time is the device's plus whatever gap the host leaves
between programs, which is what multi-step removes.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/multi_step.py --out $OUT

``--smoke`` runs the tiny model on CPU; ``--loops while,scan,unroll`` times
each way of looping a window (`step_functions.WINDOW_LOOPS`). Writes
``multi-step.json`` (ms per token for k = 1 and each k and loop, medians of
repeats, and the ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

from benchmarks.lora_step import LLAMA3_8B, DecodeBatch, make_runner, run_loop, tiny_model_dir
from benchmarks.run_stamp import run_stamp
from jaxinfer.core.scheduler_output import SchedulerOutput
from jaxinfer.models import resolve_model


def windows(batch: DecodeBatch, k: int, n: int) -> list[SchedulerOutput]:
    """n programs of k decode steps each: rows start k - 1 tokens before the
    batch's last position, so the window stays inside their pages."""
    outs = []
    for _ in range(n):
        out = batch.step([None] * batch.S)
        for row in out.scheduled:
            row.start_pos = batch.L - k
        out.num_steps = k
        outs.append(out)
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--sizes", default="1,64")
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--loops", default="while",
                    help="window loops to time (step_functions.WINDOW_LOOPS)")
    args = ap.parse_args()
    model_dir = tiny_model_dir() if args.smoke else LLAMA3_8B
    dtype = jnp.float32 if args.smoke else jnp.bfloat16
    L = 64 if args.smoke else 1024
    vocab = resolve_model(model_dir, "dummy").config.vocab_size
    ks = [int(k) for k in args.ks.split(",")]
    rows = []
    for S in (int(s) for s in args.sizes.split(",")):
        runner = make_runner(model_dir, dtype, S, L, None,
                             "reference" if args.smoke else None)
        batch = DecodeBatch(S, L, vocab)
        per_token = {}
        variants = [("1", 1, None)] + [(f"{k}-{loop}", k, loop)
                                       for loop in args.loops.split(",")
                                       for k in ks]
        for name, k, loop in variants:
            if loop is not None:
                runner.programs.use_window_loop(loop)

            def outs():
                if k == 1:
                    return [batch.step([None] * S) for _ in range(args.tokens)]
                return windows(batch, k, args.tokens // k)
            run_loop(runner, outs())  # compiles
            ts = [run_loop(runner, outs()) / args.tokens for _ in range(args.repeats)]
            per_token[name] = dict(ms=1e3 * statistics.median(ts),
                                   repeats_ms=[1e3 * t for t in ts])
            print(f"S={S} {name}: {per_token[name]['ms']:.3f} ms per step",
                  flush=True)
        rows.append(dict(S=S, L=L, per_token=per_token,
                         speedup={name: per_token["1"]["ms"] / v["ms"]
                                  for name, v in per_token.items() if name != "1"}))
        del runner
    result = dict(
        workload="multi-step", model="tiny" if args.smoke else "llama3-8b",
        **run_stamp(),
        device=str(jax.devices()[0].device_kind), jax=jax.__version__,
        rows=rows, command="python3 benchmarks/multi_step.py --out $OUT "
        f"--sizes {args.sizes} --ks {args.ks} --loops {args.loops}"
        + (" --smoke" if args.smoke else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "multi-step.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(f"S={r['S']} L={r['L']}: " + ", ".join(
            f"k={k} {v['ms']:.3f} ms/step" for k, v in r["per_token"].items())
            + "; speedup " + ", ".join(f"k={k} {x:.3f}x" for k, x in r["speedup"].items()))


if __name__ == "__main__":
    main()
