"""Pre-flight for the Mosaic GPU decode kernel without a GPU: lowers each
tuning variant the benchmarks and tests compile (bf16 and fp8 pages) for
cuda on CPU (``lower(lowering_platforms=("cuda",))``). Pallas' Mosaic GPU lowering (layouts,
transforms, barriers) runs in Python, so its errors show here; what ptxas
or the driver would reject does not. Run it under each jax version the GPU
machine may have (it had 0.11.2 while this machine had 0.10.2: one
lowering error showed under 0.11 only).

    PYTHONPATH=$PWD python benchmarks/kernels/preflight_decode_mgpu.py

Prints one line per variant and exits non-zero if any fails to lower.

A refactor that should change nothing on the GPU can be checked without
one: ``--hashes FILE`` writes each variant's lowered module (locations
left out) as a short sha256, one line per variant; run it before the
change, then with ``--compare FILE`` after it, which fails on any variant
whose kernel lowers differently.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import jax
import jax.numpy as jnp

from jaxinfer.pallas_kernels.ragged_paged_attention_decode_mgpu import decode_attention
from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import MosaicDecodeTuning
from tests.pallas_kernels.lowering import decode_lowering_args

FP8 = jnp.float8_e4m3fn
# (page dtype, head dim, GQA group, per-page scales, kernel kwargs, tuning)
CASES = [
    (jnp.bfloat16, 128, 4, False, {}, {}),
    (jnp.bfloat16, 128, 4, False, {}, {"producer_warpgroup": False}),
    (FP8, 128, 4, False, {}, {}),
    (FP8, 128, 4, True, {}, {}),
    (FP8, 128, 4, True, {}, {"no_auto_barriers": True}),
    (FP8, 128, 4, True, {}, {"staging_stages": 3}),
    (FP8, 128, 4, True, {}, {"tokens_per_step": 128}),
    (FP8, 128, 4, True, {}, {"producer_warpgroup": False}),
    (FP8, 128, 4, True, {}, {"fp8_f16": True}),
    (FP8, 128, 4, True, {}, {"fp8_producers": 2}),
    (FP8, 128, 4, True, {}, {"fp8_producers": 2, "fp8_f16": True,
                             "no_auto_barriers": True}),
    (FP8, 128, 4, True, {}, {"fp8_producers": 2, "tokens_per_step": 128}),
    (FP8, 64, 1, True, {}, {"fp8_producers": 2}),
    (FP8, 256, 4, True, {}, {}),
    (FP8, 256, 4, True, {}, {"fp8_producers": 2}),
    (FP8, 128, 8, True, {"sliding_window": 300, "logit_soft_cap": 30.0}, {}),
    (FP8, 64, 8, True, {}, {}),
    # Measurement-only probes (bench_decode_fp8.py --stages).
    (FP8, 128, 4, True, {}, {"fp8_producers": 2, "tokens_per_step": 128,
                             "no_auto_barriers": True, "probe": "no_math"}),
    (FP8, 128, 4, True, {}, {"fp8_producers": 2, "tokens_per_step": 128,
                             "no_auto_barriers": True,
                             "probe": "copies_only"}),
    (FP8, 128, 4, True, {}, {"fp8_producers": 2, "tokens_per_step": 128,
                             "no_auto_barriers": True,
                             "probe": "no_convert"}),
    (jnp.bfloat16, 128, 4, False, {}, {"probe": "no_math"}),
    (FP8, 128, 4, True, {}, {"producer_warpgroup": False, "fp8_f16": True,
                             "smem_budget": 100 * 1024}),
    # bench_decode_fp8.py --pipeline (NOTES.md v14).
    (jnp.bfloat16, 128, 4, False, {}, {"overlap_softmax": True}),
    (jnp.bfloat16, 128, 8, False, {"sliding_window": 300,
                                   "logit_soft_cap": 30.0},
     {"overlap_softmax": True}),
    # v17: swap_ab on 16-bit and fp8 pages, one warpgroup or producers,
    # groups 1-64 (R = 16, 32, 64), head dims 64-256; four producers.
    (jnp.bfloat16, 128, 4, False, {}, {"swap_ab": True}),
    (jnp.bfloat16, 64, 20, False, {}, {"swap_ab": True,
                                       "producer_warpgroup": False}),
    (FP8, 128, 4, True, {}, {"swap_ab": True, "producer_warpgroup": False}),
    (FP8, 128, 1, True, {}, {"swap_ab": True, "fp8_f16": True}),
    (FP8, 256, 64, True, {}, {"swap_ab": True, "fp8_producers": 2}),
    (FP8, 128, 8, True, {"sliding_window": 300, "logit_soft_cap": 30.0},
     {"swap_ab": True}),
    (FP8, 64, 4, True, {}, {"fp8_producers": 4, "tokens_per_step": 128}),
    (FP8, 64, 4, True, {}, {"fp8_producers": 4, "tokens_per_step": 256,
                            "smem_budget": 224 * 1024}),
] + [(FP8, 128, 4, True, kw, {"fp8_producers": 4, "tokens_per_step": 128,
                             "no_auto_barriers": True, "fp8_f16": True,
                             "smem_budget": 224 * 1024, **extra})
     for kw in ({}, {"sliding_window": 300, "logit_soft_cap": 30.0})
     for extra in ({}, {"overlap_softmax": True}, {"swap_ab": True},
                   {"swap_ab": True, "consumer_registers": 200})] + [
    (FP8, 128, 4, True, {}, {"fp8_producers": 2, "tokens_per_step": 128,
                             "no_auto_barriers": True, "fp8_f16": True,
                             "smem_budget": 224 * 1024, "swap_ab": True})] + [
    (FP8, 128, 4, True, kw, {"fp8_producers": 2, "tokens_per_step": 128,
                             "no_auto_barriers": True,
                             "smem_budget": 224 * 1024, **extra})
     for kw in ({}, {"sliding_window": 300, "logit_soft_cap": 30.0})
     for extra in ({}, {"staging_stages": 1, "v_staging_stages": 2},
                   {"v_staging_stages": 1}, {"overlap_softmax": True},
                   {"overlap_softmax": True, "v_staging_stages": 1},
                   {"overlap_softmax": True, "tokens_per_step": 64},
                   {"overlap_softmax": True, "fp8_producers": 1},
                   {"fp8_f16": True},
                   {"overlap_softmax": True, "fp8_f16": True},
                   {"staging_stages": 1, "v_staging_stages": 2,
                    "fp8_f16": True})]


def lower(page_dtype, head_dim, group, per_page, kw, tune):
    """Lowers one variant for cuda; returns a short hash of the module
    without source locations (the kernel's own module inside the custom
    call carries them unless the traceback limit is 0)."""
    def fn(q, k, v, lens, tables, *scales):
        return decode_attention(q, k, v, lens, tables, *scales,
                                sm_scale=head_dim ** -0.5,
                                tuning=MosaicDecodeTuning(**tune), **kw)
    args = decode_lowering_args(page_dtype, head_dim, group, per_page)
    text = jax.jit(fn).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text(debug_info=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hashes", help="write each variant's lowering hash")
    ap.add_argument("--compare", help="fail where a hash differs from FILE's")
    a = ap.parse_args()
    jax.config.update("jax_traceback_in_locations_limit", 0)
    print("jax", jax.__version__)
    before = (open(a.compare).read().split() if a.compare
              else [None] * len(CASES))
    failed, hashes = 0, []
    for case, old in zip(CASES, before):
        name = (f"{jnp.dtype(case[0]).name} H={case[1]} G={case[2]} "
                f"per_page={case[3]} {case[4]} {case[5]}")
        try:
            digest = lower(*case)
            hashes.append(digest)
            if old is not None and digest != old:
                failed += 1
                print("DIFF", name, old, "->", digest, flush=True)
            else:
                print("ok  ", name, flush=True)
        except Exception as e:  # report every variant, then fail
            failed += 1
            hashes.append("failed")
            print("FAIL", name, repr(e)[:400], flush=True)
    if a.hashes:
        with open(a.hashes, "w") as f:
            f.write("\n".join(hashes) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
