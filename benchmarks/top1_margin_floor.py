"""Why 98% greedy top-1 agreement sits at the
embedded SmolLM2-135M's noise floor: the float model's top-1 margins at
the 1,000 teacher-forced positions of tests/models/test_quantized_accuracy.py
against how far each weight format moves them. CPU, a few minutes:

    PYTHONPATH=$PWD python benchmarks/top1_margin_floor.py

For each variant (bf16 weights and compute; int8 and fp8 quantized at
load; fp8 weight-only per channel) it records the measured agreement, the
median and 90th-percentile change of the float model's own margin (top-1
logit minus runner-up, in log-probability), the float margin of the
positions that flipped, and ``noise_scale_for_98``: the largest s (in
steps of 0.01) for which the float logits moved by s times the variant's
change, ref + s * (got - ref), still agree on 98% (the change is nearly
linear in small weight errors, so s says how much smaller the variant's
error would have to be: 0.5, half).

Writes ``benchmarks/results/top1-margin-floor-cpu.json``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.quant_accuracy import float_reference, with_scheme, write_results
from jaxinfer.models import resolve_model
from jaxinfer.models.quantization.methods import Fp8Weights
from tests.models import test_quantized_accuracy as T

THRESHOLDS = (0.01, 0.03, 0.1, 0.3)  # margins, log-probability


def quantized_logits(traj, method, scheme=None):
    files = (resolve_model(T.MODEL, quantization=method) if scheme is None
             else with_scheme(method, scheme))
    return T._logits(files, traj)


def margins(logp, top1, top2):
    rows = np.arange(len(top1))
    return logp[rows, top1] - logp[rows, top2]


def noise_scale_for(ref, got, top1, target=0.98):
    """The largest s in [0, 1] (steps of 0.01) at which ref + s * (got -
    ref) still picks the float model's top-1 at ``target`` of positions."""
    best = 0.0
    for s in np.arange(1, 101) / 100:
        if np.mean((ref + s * (got - ref)).argmax(-1) == top1) >= target:
            best = float(s)
    return best


def main():
    traj, ref = float_reference()
    ref_logp = np.asarray(jax.nn.log_softmax(jnp.asarray(ref), -1))
    order = np.argsort(-ref_logp, axis=-1)[:, :2]
    top1, top2 = order[:, 0], order[:, 1]
    margin = margins(ref_logp, top1, top2)
    floor = {f"share_with_margin_under_{t}": float(np.mean(margin < t))
             for t in THRESHOLDS}
    print("float margins:", floor, flush=True)
    variants = [
        ("bf16 weights and compute", lambda: T._logits(
            resolve_model(T.MODEL), traj, jnp.bfloat16).astype(np.float32)),
        ("int8 at load (per channel, amax/127)",
         lambda: quantized_logits(traj, "int8")),
        ("fp8 at load (per channel, per token)",
         lambda: quantized_logits(traj, "fp8")),
        ("fp8 weight-only (per channel)",
         lambda: quantized_logits(traj, "fp8", Fp8Weights(
             per_channel=True, activation="none"))),
    ]
    rows = []
    for name, run in variants:
        got = run()
        logp = np.asarray(jax.nn.log_softmax(jnp.asarray(got), -1))
        change = margins(logp, top1, top2) - margin
        agree = float(np.mean(got.argmax(-1) == top1))
        flipped = got.argmax(-1) != top1
        rows.append(dict(
            variant=name, top1=agree,
            median_abs_margin_change=float(np.median(np.abs(change))),
            p90_abs_margin_change=float(np.percentile(np.abs(change), 90)),
            median_float_margin_of_flips=(float(np.median(margin[flipped]))
                                          if flipped.any() else None),
            noise_scale_for_98=noise_scale_for(ref, got, top1)))
        print(rows[-1], flush=True)
    rows.insert(0, dict(variant="float model's own margins", **floor,
                        median_margin=float(np.median(margin))))
    print(write_results("top1-margin-floor", rows, int(ref.shape[0])))


if __name__ == "__main__":
    main()
