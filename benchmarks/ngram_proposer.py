"""The n-gram proposer's host cost per step (`jaxinfer/spec_decode/ngram.py`):
``propose_ngram`` over a batch of B sequences of L tokens, random tokens
(nothing recurs but single tokens) and repetitive ones (a 50-token
vocabulary: long runs recur), for several suffix-length ranges. CPU, repo
root:

    python benchmarks/ngram_proposer.py --out benchmarks/results

Writes ``ngram-proposer-cpu.json``: per case the median of ``--repeats``
timed calls, in ms. With ``--compare REV`` (a git revision) each case also
times that revision's ``propose_ngram`` and checks both propose alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_stamp import run_stamp

from jaxinfer.spec_decode.ngram import propose_ngram

CASES = [  # (B, L, n_min, n_max)
    (1, 450, 5, 5), (64, 450, 5, 5), (64, 450, 2, 5), (64, 450, 1, 5),
    (256, 1000, 2, 5)]


def batch(B: int, L: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, L).tolist() for _ in range(B)]


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def load_other(rev: str):
    """``propose_ngram`` of jaxinfer/spec_decode/ngram.py at git ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:jaxinfer/spec_decode/ngram.py"],
                            capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("ngram_other", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.unlink(f.name)
    return module.propose_ngram


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--compare", default=None,
                    help="a git revision whose ngram.py is timed beside this one")
    args = ap.parse_args()
    other = load_other(args.compare) if args.compare else None
    rows = []
    for B, L, n_min, n_max in CASES:
        for kind, vocab in (("random", 32000), ("repetitive", 50)):
            seqs = batch(B, L, vocab, seed=B + L)
            limits = [4] * B
            row = dict(B=B, L=L, n_min=n_min, n_max=n_max, tokens=kind,
                       ms=median_ms(lambda: propose_ngram(seqs, limits, n_min, n_max),
                                    args.repeats))
            if other is not None:
                assert other(seqs, limits, n_min, n_max) == propose_ngram(
                    seqs, limits, n_min, n_max), (B, L, n_min, n_max, kind)
                row["compared_ms"] = median_ms(
                    lambda: other(seqs, limits, n_min, n_max), args.repeats)
            rows.append(row)
            print(f"B={B:4} L={L:5} n {n_min}..{n_max} {kind:10} "
                  f"{row['ms']:7.2f} ms" + (f"  (compared: {row['compared_ms']:.2f} ms)"
                                            if other else ""), flush=True)
    out = dict(run_stamp(), workload="n-gram proposer host time per step "
               "(propose_ngram), random and repetitive token batches",
               device="CPU", compared=args.compare, cases=rows)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "ngram-proposer-cpu.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
