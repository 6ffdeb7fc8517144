"""One Mosaic decode kernel call, for Nsight Compute and Mosaic's ptxas /
SASS dumps (GPU machine, repo root):

    ncu --clock-control none -c 20 --section SpeedOfLight ... \\
      python3 benchmarks/kernels/profile_decode_fp8.py --variant default

Builds bench_decode_fp8.py's S=64 L=2048 inputs on the host (so the only
device kernels are the call's own: the scale gather, the kernel, the
output cast) and calls ``decode_attention`` twice with the variant's
tuning. Variants: the fp8 default tuning whole, with
``MosaicDecodeTuning.probe``'s stages left out and with ``fp8_f16``, and
bf16 pages.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import sys

SMOKE = "--smoke" in sys.argv  # tiny shapes, interpret mode: checks the script
S, L, N, K, H, B = (2, 256, 8, 2, 128, 16) if SMOKE else (64, 2048, 32, 8,
                                                           128, 16)
VARIANTS = ("default", "no_convert", "no_math", "copies_only", "bf16", "f16")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, default="default")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
        FP8_MOSAIC_DECODE,
        default_tuning,
    )

    rng = np.random.default_rng(0)
    pages_per_seq = L // B
    num_pages = S * pages_per_seq + 1
    fp8 = a.variant != "bf16"
    dt = ml_dtypes.float8_e4m3fn if fp8 else ml_dtypes.bfloat16
    kp = rng.standard_normal((K, num_pages, B, H), np.float32).astype(dt)
    vp = rng.standard_normal((K, num_pages, B, H), np.float32).astype(dt)
    q = rng.standard_normal((S, K, N // K, H), np.float32).astype(
        ml_dtypes.bfloat16)
    tables = (1 + rng.permutation(S * pages_per_seq)).reshape(
        S, pages_per_seq).astype(np.int32)
    lens = np.full((S,), L, np.int32)
    scales = rng.uniform(0.01, 0.02, (K, 2, num_pages)).astype(np.float32) \
        if fp8 else None
    if fp8:
        tuning = FP8_MOSAIC_DECODE if a.variant == "default" else \
            dataclasses.replace(FP8_MOSAIC_DECODE, fp8_f16=True) \
            if a.variant == "f16" else \
            dataclasses.replace(FP8_MOSAIC_DECODE, probe=a.variant)
    else:
        tuning = default_tuning(H, B, "NVIDIA H200").mosaic_decode
    args = [jax.device_put(x) for x in (q, kp, vp, lens, tables)]
    if fp8:
        args.append(jax.device_put(scales))

    @jax.jit
    def fn(q, kp, vp, lens, tables, *sc):
        return mg.decode_attention(q, kp, vp, lens, tables, *sc,
                                   sm_scale=H ** -0.5, tuning=tuning,
                                   interpret=SMOKE)
    for _ in range(2):
        out = jax.block_until_ready(fn(*args))
    print(a.variant, tuning, float(jnp.abs(out).mean()))


if __name__ == "__main__":
    main()
