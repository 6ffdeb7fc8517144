"""Writes the jaxprs of the attention kernels for representative calls, so a
refactor of pallas_kernels/ can show that the traced programs did not change.

Runs on CPU (tracing only; nothing executes). Usage, from a checkout:

    PYTHONPATH=. python benchmarks/kernels/dump_jaxprs.py OUT_DIR
    # change the kernels, dump again, then: diff -r BEFORE_DIR AFTER_DIR

Two kinds of output: the jaxprs of the public function and the Mosaic
prefill wrapper in interpret mode (``*.txt``), and the Mosaic GPU kernels
lowered for Hopper without a GPU (``*.mlir``: the serialized kernel modules
a GPU would compile). Source locations are dropped from both (Pallas records
each kernel body's file and line; the lowered modules would carry every
line number), so moving code or renaming a file leaves the dump unchanged
while any change to the traced operations shows.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys

# No source lines inside the lowered kernel modules (set before jax loads).
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")

import jax
import jax.numpy as jnp

from jaxinfer.pallas_kernels import ragged_paged_attention
from jaxinfer.pallas_kernels import ragged_paged_attention_prefill_mgpu as pm
from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
    MosaicDecodeTuning,
    RaggedPagedAttentionTuning,
)
from tests.pallas_kernels.cases import make_case

MIX = [(1, 1), (5, 18), (1, 129), (120, 597)]
DECODES = [(1, 700), (1, 45), (1, 333)]


def _cases():
    f32 = make_case(MIX, num_q_heads=8, num_kv_heads=2, page_size=16)
    bf16 = make_case(MIX, num_q_heads=8, num_kv_heads=2, head_dim=128,
                     page_size=16, dtype=jnp.bfloat16)
    dec = make_case(DECODES, num_q_heads=8, num_kv_heads=2, head_dim=128,
                    page_size=16, dtype=jnp.bfloat16)
    triton = RaggedPagedAttentionTuning(decode_pages_per_block=2,
                                        decode_kv_splits=4)
    mosaic = RaggedPagedAttentionTuning(
        decode_backend="mosaic",
        mosaic_decode=MosaicDecodeTuning(num_stages=2, kv_splits=2))
    one_wg = dataclasses.replace(mosaic, mosaic_decode=MosaicDecodeTuning(
        num_stages=2, kv_splits=2, producer_warpgroup=False))
    api = functools.partial(ragged_paged_attention, sm_scale=0.125,
                            interpret=True)
    yield "triton_mixed", functools.partial(api, tuning=triton), f32
    yield "triton_mixed_window_cap", functools.partial(
        api, tuning=triton, sliding_window=100, logit_soft_cap=5.0), f32
    yield "triton_decode_only", functools.partial(
        api, tuning=triton, decode_only=True), dec
    yield "default_tuning_bf16", api, bf16
    yield "mosaic_decode", functools.partial(api, tuning=mosaic), dec
    yield "mosaic_decode_only_window", functools.partial(
        api, tuning=mosaic, decode_only=True, sliding_window=64), dec
    yield "mosaic_decode_one_warpgroup", functools.partial(api, tuning=one_wg), dec
    for name, tuning, kw in [
            ("mosaic_prefill", pm.MosaicPrefillTuning(), {}),
            ("mosaic_prefill_window_cap_scales",
             pm.MosaicPrefillTuning(tokens_per_step=64, num_stages=4),
             dict(sliding_window=100, logit_soft_cap=30.0, k_scale=0.5,
                  v_scale=2.0))]:
        yield name, functools.partial(pm.prefill_attention, sm_scale=0.1,
                                      tuning=tuning, **kw), bf16


def _lowered_cases():
    """The Mosaic GPU kernels compiled for Hopper (lowered without a GPU):
    the programs a GPU would run, whatever Python wraps them."""
    case = make_case(MIX, num_q_heads=8, num_kv_heads=2, head_dim=128,
                     page_size=16, dtype=jnp.bfloat16)
    mosaic = RaggedPagedAttentionTuning(
        decode_backend="mosaic", prefill_backend="mosaic",
        mosaic_decode=MosaicDecodeTuning(num_stages=2, kv_splits=2))
    yield "hopper_api_mosaic", functools.partial(
        ragged_paged_attention, sm_scale=0.125, tuning=mosaic), case
    yield "hopper_api_mosaic_decode_only", functools.partial(
        ragged_paged_attention, sm_scale=0.125, tuning=mosaic,
        decode_only=True), case


def _write(out_dir, name, text):
    # Kernel source lines (Pallas records each body's file and line).
    text = re.sub(r" at [^\s,)]+:\d+", "", text)
    text = re.sub(r"loc\([^)]*\)", "loc()", text)
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(text)
    print(f"{name}: {len(text)} characters")


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for name, fn, case in _cases():
        _write(out_dir, f"{name}.txt", str(jax.make_jaxpr(fn)(*case)))
    for name, fn, case in _lowered_cases():
        lowered = jax.jit(fn).trace(*case).lower(lowering_platforms=("cuda",))
        _write(out_dir, f"{name}.mlir", lowered.as_text())


if __name__ == "__main__":
    main(sys.argv[1])
