"""Why 98% greedy top-1 agreement (issue 15, Done-when 1) sits at the
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

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.quant_accuracy import float_reference, write_results
from jaxinfer.models import (load_params, model_class, model_constants,
                             resolve_model)
from jaxinfer.models.quantization.config import QuantizationConfig
from jaxinfer.models.quantization.methods import Fp8Weights
from tests.models import test_quantized_accuracy as T
from tests.models.forward import packed_prefill_logits

THRESHOLDS = (0.01, 0.03, 0.1, 0.3)  # margins, log-probability


def bf16_logits(traj):
    """The float checkpoint run in bf16 (weights and compute)."""
    seqs, plens = traj
    files = resolve_model(T.MODEL)
    model = model_class(files.config.architecture)(files.config)
    out = packed_prefill_logits(model, load_params(files, jnp.bfloat16),
                                model_constants(model, 256), seqs, 16,
                                jnp.bfloat16)
    return np.concatenate([lg[n - 1:-1] for lg, n in zip(out, plens)]
                          ).astype(np.float32)


def quantized_logits(traj, method, scheme=None):
    files = resolve_model(T.MODEL, quantization=method)
    if scheme is not None:
        files = dataclasses.replace(files, config=dataclasses.replace(
            files.config, quantization=QuantizationConfig(method, "float",
                                                          scheme)))
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
        ("bf16 weights and compute", lambda: bf16_logits(traj)),
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
