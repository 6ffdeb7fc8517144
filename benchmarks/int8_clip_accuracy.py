"""int8 (weight-only, one scale per output channel) with the scale at the
channel's amax / 127 (the at-load default) against scales searched per
channel for the least squared rounding error over c * amax / 127, c in
[c_min, 1] (clipping the largest weights), on the embedded SmolLM2-135M:
teacher-forced greedy top-1 agreement and mean KL with the float model
over the 1,000 positions of tests/models/test_quantized_accuracy.py. CPU,
a few minutes:

    PYTHONPATH=$PWD python benchmarks/int8_clip_accuracy.py

Writes ``benchmarks/results/int8-clip-accuracy-cpu.json``. Measurement
only: the searched scales replace ``quantize_linear``'s int8 branch for
the run (the shipped loader keeps amax / 127).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.quant_accuracy import float_reference, write_results
from jaxinfer.models import resolve_model
from jaxinfer.models.quantization import hf_checkpoints, loading
from tests.models import test_quantized_accuracy as T

C_MINS = (None, 0.5, 0.7, 0.85)  # None: amax / 127
AMAX = hf_checkpoints.quantize_linear


def searched_scales(w, c_min: float, steps: int = 41):
    """Per output channel, the scale c * amax / 127 (c in [c_min, 1]) whose
    round-to-nearest codes give the least squared error."""
    amax = jnp.max(jnp.abs(w), axis=1)
    best = best_err = None
    for c in np.linspace(c_min, 1.0, steps):
        s = jnp.where(amax > 0, amax * c / 127, 1.0)
        q = jnp.clip(jnp.round(w / s[:, None]), -127, 127)
        err = jnp.sum((q * s[:, None] - w) ** 2, axis=1)
        if best is None:
            best, best_err = s, err
        else:
            better = err < best_err
            best = jnp.where(better, s, best)
            best_err = jnp.where(better, err, best_err)
    return best


def with_c_min(c_min):
    def quantize_linear(scheme, get, prefix, layout, source):
        if c_min is None or isinstance(scheme, hf_checkpoints.Fp8Weights):
            return AMAX(scheme, get, prefix, layout, source)
        O, out, In = hf_checkpoints._dims(layout)
        w = jnp.asarray(hf_checkpoints._tensor(get, prefix + "weight",
                                               (out, In), source), jnp.float32)
        s = searched_scales(w, c_min)
        codes = jnp.clip(jnp.round(w / s[:, None]), -127, 127)
        return {"weight": np.asarray(codes.astype(jnp.int8)).reshape(*O, In),
                "weight_scale": np.asarray(s).reshape(O)}
    return quantize_linear


def main():
    traj, ref = float_reference()
    rows = []
    for c_min in C_MINS:
        loading.quantize_linear = with_c_min(c_min)
        try:
            got = T._logits(resolve_model(T.MODEL, quantization="int8"), traj)
        finally:
            loading.quantize_linear = AMAX
        top1, kl = T._agreement(ref, got)
        rows.append(dict(scales="amax / 127" if c_min is None else
                         f"searched, c in [{c_min}, 1]", top1=top1, kl=kl))
        print(rows[-1], flush=True)
    write_results("int8-clip-accuracy", rows, int(ref.shape[0]))


if __name__ == "__main__":
    main()
