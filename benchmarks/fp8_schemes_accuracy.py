"""fp8 quantized at load, each scale scheme, against the float model on the
embedded SmolLM2-135M: teacher-forced greedy top-1 agreement and mean KL
over the 1,000 positions of tests/models/test_quantized_accuracy.py (its
eight prompts and the float model's own 125 greedy tokens each). CPU, a
few minutes:

    PYTHONPATH=$PWD python benchmarks/fp8_schemes_accuracy.py

Writes ``benchmarks/results/fp8-schemes-accuracy-cpu.json``.
"""

from __future__ import annotations

from benchmarks.quant_accuracy import float_reference, with_scheme, write_results
from jaxinfer.models.quantization.methods import Fp8Weights
from tests.models import test_quantized_accuracy as T

SCHEMES = [(False, "per_tensor"), (True, "per_tensor"), (False, "per_token"),
           (True, "per_token"), (True, "none")]


def main():
    traj, ref = float_reference()
    rows = []
    for per_channel, activation in SCHEMES:
        quantized = with_scheme("fp8", Fp8Weights(per_channel=per_channel,
                                                  activation=activation))
        top1, kl = T._agreement(ref, T._logits(quantized, traj))
        rows.append(dict(per_channel_weights=per_channel,
                         activations=activation, top1=top1, kl=kl))
        print(rows[-1], flush=True)
    write_results("fp8-schemes-accuracy", rows, int(ref.shape[0]))


if __name__ == "__main__":
    main()
