"""fp8 KV pages on the Mosaic GPU decode kernel, against bf16 pages and the
copy bandwidth, in one run.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/bench_decode_fp8.py --out $OUT

1. probe (own process, time-limited): a small ragged fp8 case with per-page
   scales through the Mosaic kernel (one and two producer warpgroups, one
   warpgroup alone) against the jnp reference; stops the run if it fails
   or hangs;
2. copy bandwidth of this run (torch ``copy_`` of 2 GiB, read + written);
3. S=64 L=2048 N=32 K=8 H=128 page 16 (llama3-8b decode, the inputs of
   ``quant_step.py``'s kv section: random pages, per-page scales in
   [0.01, 0.02]), decode-only steps, 16 calls per program
   (``time_chained``): bf16 pages on the Mosaic kernel; fp8 pages on the
   Mosaic kernel (tuning variants) and on the Triton kernel; each kernel
   alone (``decode_attention``, its wrapper's gathers included); every fp8
   variant's output checked against the reference on the same inputs.
   Bytes: K+V pages read once, in their dtype, plus the per-page scales.

``--stages`` times only the fp8 default tuning and bf16 pages, whole and
with ``MosaicDecodeTuning.probe``'s stages left out (measurement only:
wrong outputs), for the copy pipeline's own floor (NOTES.md v13).

Prints a table last; writes decode-fp8-mgpu-h200.json to --out.
``--smoke`` runs it all on tiny shapes in interpret mode on CPU (no copy
bandwidth, timings meaningless), to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["BENCH_SMOKE"] = "1"  # bench_attention's tiny-shape switch

from benchmarks.kernels.bench_attention import batch, roofline, time_chained

S, L, N, K, H, B = (2, 128, 8, 2, 64, 16) if SMOKE else (64, 2048, 32, 8,
                                                           128, 16)
# The command as run (its flags decide the rows: --stages times other
# variants than the default run).
COMMAND = ("export PYTHONPATH=$PWD; python3 benchmarks/kernels/"
           "bench_decode_fp8.py --out $OUT"
           + "".join(f" {x}" for x in sys.argv[1:] if x in ("--stages",
                                                           "--pipeline",
                                                           "--smoke")
                    or x.startswith("--only")))
# fp8 Mosaic tuning variants (MosaicDecodeTuning fields); "ws" = default,
# "ws2" = two dequantizing producer warpgroups (K and V), "nab" = no
# automatic warpgroup barriers, "f16" = wgmmas in f16, "t128" = 128-token
# steps. The first run (NOTES.md v10) timed ws, ws_nab, ws_f16, 1wg and
# 64/128-token, 2/3-tile staging variants of the one-producer kernel.
VARIANTS = {
    "ws": {},
    "ws2": {"fp8_producers": 2},
    "ws2_nab": {"fp8_producers": 2, "no_auto_barriers": True},
    "ws2_f16_nab": {"fp8_producers": 2, "fp8_f16": True,
                    "no_auto_barriers": True},
    "ws2_t128_nab": {"fp8_producers": 2, "tokens_per_step": 128,
                     "no_auto_barriers": True},
    "ws_nab": {"no_auto_barriers": True},
    "ws_f16": {"fp8_f16": True},
    "1wg": {"producer_warpgroup": False},
}

# --pipeline (NOTES.md v14): how many steps the stages keep in flight, on
# the fp8 default (two producers, 128-token steps, no automatic barriers).
# "b224" = a 224 KiB smem budget (the default's 200 KiB leaves one staging
# tile per kind); "k1v2" = K staged one tile deep, V two (V's convert of
# the next step during this step's PV); "ov" = the softmax during the next
# step's QK^T (overlap_softmax; staging 2 + 2 in a 2-step ring).
FP8_DEFAULT = {"fp8_producers": 2, "tokens_per_step": 128,
               "no_auto_barriers": True}
B224 = {**FP8_DEFAULT, "smem_budget": 224 * 1024}
PIPELINE_VARIANTS = {
    "default": FP8_DEFAULT,
    "b224": B224,
    "b224_k1v2": {**B224, "staging_stages": 1, "v_staging_stages": 2},
    "b224_k2v1": {**B224, "v_staging_stages": 1},
    "b224_ov": {**B224, "overlap_softmax": True},
    "b224_ov_k2v1": {**B224, "overlap_softmax": True, "v_staging_stages": 1},
    "b224_ov_t64": {**B224, "overlap_softmax": True, "tokens_per_step": 64},
    "b224_ov_1p": {**B224, "overlap_softmax": True, "fp8_producers": 1},
    # v15: the f16 convert (e4m3x2 -> f16x2 and an f16x2 scale multiply, no
    # f32 round trip): half the fp8 default's instructions are its convert.
    "f16": {**FP8_DEFAULT, "fp8_f16": True},
    "b224_f16": {**B224, "fp8_f16": True},
    "b224_k1v2_f16": {**B224, "staging_stages": 1, "v_staging_stages": 2,
                      "fp8_f16": True},
    "b224_ov_f16": {**B224, "overlap_softmax": True, "fp8_f16": True},
    # v16: one warpgroup per program (copies, convert and math in turn), at
    # the default 200 KiB (one program per SM) and at 100 KiB (two: the
    # "more programs per SM" reading of v14, with no kernel change).
    "1wg": {"producer_warpgroup": False},
    "1wg_f16": {"producer_warpgroup": False, "fp8_f16": True},
    "1wg_b100": {"producer_warpgroup": False, "smem_budget": 100 * 1024},
    "1wg_b100_f16": {"producer_warpgroup": False, "fp8_f16": True,
                     "smem_budget": 100 * 1024},
    # v17: more warps per SM inside one program (four producer warpgroups,
    # each a kind's 64-token half of every step), and swap_ab's consumer
    # light enough in registers to leave the producers 80 each.
    "swap_f16": {**B224, "fp8_f16": True, "swap_ab": True},
    "p4_f16": {**B224, "fp8_f16": True, "fp8_producers": 4},
    "p4_ov_f16": {**B224, "fp8_f16": True, "fp8_producers": 4,
                  "overlap_softmax": True},
    "p4_swap_f16": {**B224, "fp8_f16": True, "fp8_producers": 4,
                    "swap_ab": True},
    "p4_swap_f16_c200": {**B224, "fp8_f16": True, "fp8_producers": 4,
                         "swap_ab": True, "consumer_registers": 200},
}
# --only NAME,NAME: a subset of PIPELINE_VARIANTS (and no bf16 rows).


def probe():
    """Small fp8 cases compiled, against the reference (own process)."""
    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import (
        RaggedPagedAttentionTuning,
        ragged_paged_attention,
        ragged_paged_attention_reference,
    )
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import MosaicDecodeTuning
    from tests.pallas_kernels.cases import fp8_case, rel_error
    case, ks, vs = fp8_case([(1, 1), (1, 129), (1, 700), (1, 2000)][
        :2 if SMOKE else 4], num_q_heads=N, num_kv_heads=K, head_dim=H,
        seed=1)
    ref = ragged_paged_attention_reference(*case, sm_scale=H ** -0.5,
                                           k_scale=ks, v_scale=vs,
                                           decode_only=True)
    for tune in ({}, {"fp8_producers": 2}, {"producer_warpgroup": False},
                 {**B224, "overlap_softmax": True},
                 {**B224, "staging_stages": 1, "v_staging_stages": 2},
                 {**B224, "fp8_f16": True, "swap_ab": True},
                 {**B224, "fp8_f16": True, "fp8_producers": 4}):
        t = RaggedPagedAttentionTuning(
            decode_backend="mosaic", mosaic_decode=MosaicDecodeTuning(**tune))
        out = ragged_paged_attention(*case, sm_scale=H ** -0.5, tuning=t,
                                     k_scale=ks, v_scale=vs, decode_only=True,
                                     interpret=SMOKE)
        err = rel_error(out[:4], ref[:4])
        print(f"probe {tune} rel err {err:.2e}", flush=True)
        assert err < 2e-2 and bool(jnp.all(jnp.isfinite(
            out.astype(jnp.float32)))), err


def once(fn, *args):
    """Seconds of one call after a first (smoke mode: no timing)."""
    import time

    import jax
    jax.block_until_ready(jax.jit(fn)(*args))
    t = time.perf_counter()
    jax.block_until_ready(jax.jit(fn)(*args))
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--stages", action="store_true",
                    help="time only the fp8 default and bf16 pages, whole "
                    "and with MosaicDecodeTuning.probe's stages left out "
                    "(NOTES.md v13)")
    ap.add_argument("--only", default="",
                    help="with --pipeline: these PIPELINE_VARIANTS only")
    ap.add_argument("--pipeline", action="store_true",
                    help="time PIPELINE_VARIANTS (fp8) and bf16 pages with "
                    "and without overlap_softmax (NOTES.md v14)")
    a = ap.parse_args()
    if a.probe:
        probe()
        return
    r = subprocess.run([sys.executable, __file__, "--probe",
                        *(["--smoke"] if SMOKE else [])], timeout=600 if SMOKE else 150)
    if r.returncode:
        print("probe failed: no timings", flush=True)
        sys.exit(1)

    import dataclasses

    import jax
    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import (
        ragged_paged_attention,
        ragged_paged_attention_reference,
    )
    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
        MosaicDecodeTuning,
        default_tuning,
    )
    from tests.pallas_kernels.cases import rel_error

    roof = roofline()
    bw = roof["bw"]
    print(f"copy BW {bw / 1e12:.2f} TB/s ({roof['device']})", flush=True)
    q, kp, vp, *md = batch([(1, L)] * S, jax.random.key(11), jnp.bfloat16,
                           num_q_heads=N, num_kv_heads=K, head_dim=H)
    kv_lens, tables = md[0], md[1]
    num_pages = kp.shape[1]
    scales = jax.random.uniform(jax.random.key(12), (2, K, num_pages),
                                minval=0.01, maxval=0.02)
    pages = {"bf16": (kp, vp), "fp8": (kp.astype(jnp.float8_e4m3fn),
                                       vp.astype(jnp.float8_e4m3fn))}
    nbytes = {"bf16": S * L * 2 * K * H * 2,
              "fp8": S * L * 2 * K * H + S * (L // B) * 2 * K * 4}
    ref = {}
    rows = []

    def reference(dt):
        if dt not in ref:
            kw = dict(k_scale=scales[0], v_scale=scales[1]) if dt == "fp8" \
                else {}
            ref[dt] = ragged_paged_attention_reference(
                q, *pages[dt], *md, sm_scale=H ** -0.5, decode_only=True,
                **kw)
        return ref[dt]

    def run(label, dt, fn, args, check=None):
        row = dict(variant=label, pages=dt, S=S, L=L, bytes=nbytes[dt])
        try:
            if check is not None:
                row["rel_err"] = rel_error(check(), reference(dt))
            ts = time_chained(fn, *args) if not SMOKE else [once(fn, *args)]
            med = statistics.median(ts)
            row.update(repeats_s=ts, us=med * 1e6,
                       copy_bw_fraction=nbytes[dt] / med / bw)
        except Exception as e:
            row["error"] = "".join(traceback.format_exception(e))[-3000:]
            print(f"{label} FAILED:\n{row['error'][-1500:]}", flush=True)
        rows.append(row)
        print({k: v for k, v in row.items() if k not in ("repeats_s",
                                                        "error")},
              flush=True)

    base = default_tuning(H, B)

    def api(dt, **tune):
        tuning = dataclasses.replace(base, **tune)
        kw = dict(k_scale=scales[0], v_scale=scales[1]) if dt == "fp8" \
            else {}
        fn = functools.partial(ragged_paged_attention, sm_scale=H ** -0.5,
                               tuning=tuning, decode_only=True,
                               interpret=SMOKE, **kw)
        return fn, (q, *pages[dt], *md), lambda: jax.jit(fn)(
            q, *pages[dt], *md)

    def kernel(dt, mt):
        page_scales = jnp.stack([scales[0], scales[1]], axis=1) \
            if dt == "fp8" else None
        lens = kv_lens

        def fn(qd, kp_, vp_):
            o = mg.decode_attention(qd, kp_, vp_, lens, tables, page_scales,
                                    sm_scale=H ** -0.5, tuning=mt,
                                    interpret=SMOKE)
            return o.astype(jnp.bfloat16)
        return fn, (q.reshape(S, K, N // K, H), *pages[dt])

    def write():
        out = dict(workload="decode-fp8-mgpu", command=COMMAND,
                   device=roof["device"], jax=jax.__version__,
                   date=datetime.datetime.now(
                       datetime.timezone.utc).isoformat(),
                   params=dict(S=S, L=L, N=N, K=K, H=H, page=B,
                               scales="per page, uniform [0.01, 0.02]",
                               timing="time_chained: 16 calls per program, "
                               "median of 9 repeats", decode_only=True),
                   bw_bytes_per_s=bw, copy_repeats_s=roof["copy_s"],
                   variants=(PIPELINE_VARIANTS if a.pipeline else {}
                             if a.stages else VARIANTS), rows=rows)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "decode-fp8-mgpu-h200.json"),
                  "w") as f:
            json.dump(out, f, indent=1)

    # Most telling first, the file rewritten after each row (a run cut
    # short keeps what it timed).
    def fp8_variant(label):
        fn, args, check = api("fp8", decode_backend="mosaic",
                              mosaic_decode=MosaicDecodeTuning(
                                  **VARIANTS[label]))
        run(f"api_mosaic_{label}", "fp8", fn, args, check)

    def all_variants():
        fp8_variant("ws")
        write()
        fn, args, _ = api("bf16", decode_backend="mosaic")
        run("api_mosaic", "bf16", fn, args)
        fn, args, check = api("fp8", decode_backend="triton")
        run("api_triton", "fp8", fn, args, check)
        write()
        for label in VARIANTS:
            if label == "ws" or (SMOKE and label != "1wg"):
                continue
            fp8_variant(label)
            write()
        fn, args = kernel("fp8", MosaicDecodeTuning())
        run("kernel_mosaic_ws", "fp8", fn, args)
        write()

    if a.stages:  # the default fp8 tuning, whole and stage by stage
        fp8_default = default_tuning(H, B, kv_itemsize=1).mosaic_decode
        for left_out in ("", "no_convert", "no_math", "copies_only"):
            tune = dataclasses.replace(fp8_default, probe=left_out)
            fn, args, check = api("fp8", decode_backend="mosaic",
                                  mosaic_decode=tune)
            run(f"fp8_default{'_' + left_out if left_out else ''}", "fp8",
                fn, args, None if left_out else check)
            write()
        for left_out in ("", "no_math"):
            fn, args, _ = api("bf16", decode_backend="mosaic",
                              mosaic_decode=dataclasses.replace(
                                  base.mosaic_decode, probe=left_out))
            run(f"bf16_default{'_' + left_out if left_out else ''}", "bf16",
                fn, args)
            write()
    elif a.pipeline:
        only = [x for x in a.only.split(",") if x]
        for label, tune in PIPELINE_VARIANTS.items():
            if only and label not in only:
                continue
            fn, args, check = api("fp8", decode_backend="mosaic",
                                  mosaic_decode=MosaicDecodeTuning(**tune))
            run(f"fp8_{label}", "fp8", fn, args, check)
            write()
        for overlap in (False, True) if not only else ():
            fn, args, check = api("bf16", decode_backend="mosaic",
                                  mosaic_decode=dataclasses.replace(
                                      base.mosaic_decode,
                                      overlap_softmax=overlap))
            run("bf16_default" + ("_ov" if overlap else ""), "bf16", fn,
                args, check)
            write()
    else:
        all_variants()
    print(f"\ncopy BW {bw / 1e12:.2f} TB/s ({roof['device']}); "
          f"S={S} L={L} N={N} K={K} H={H} page {B}, decode-only, chained")
    for r in rows:
        if "us" in r:
            err = f"{r['rel_err']:.1e}" if "rel_err" in r else "-"
            print(f"{r['pages']:5s} {r['variant']:22s} {r['us']:7.1f} us "
                  f"{r['copy_bw_fraction']:5.2f} of copy  err {err}")
        else:
            print(f"{r['pages']:5s} {r['variant']:22s} failed")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
