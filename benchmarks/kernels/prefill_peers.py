"""Where the prefill ceiling of each Pallas backend lies, on the llama3-8b prefill shape.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/prefill_peers.py --out $OUT

8 sequences x 2048 tokens, causal, N=32 q heads, K=8 kv heads, H=128, bf16,
against the bf16 matmul rate measured in the same run:

* ours: ``ragged_paged_attention`` (Triton lowering) over random page tables
  and over in-order page tables (does the page gather cost anything?);
* JAX's bundled Triton flash attention (``pallas.ops.gpu.attention.mha``) on
  contiguous K/V (kv heads repeated): the ceiling of the Triton lowering;
* JAX's bundled Mosaic GPU attention (``attention_mgpu``, wgmma + TMA; it
  takes float16 only, which runs at the bf16 tensor-core rate): the ceiling
  of the Mosaic GPU lowering;
* cuDNN (``jax.nn.dot_product_attention``).

The answer decides whether a paged prefill kernel should move to Mosaic GPU
(see pallas_kernels/NOTES.md). Prints a table; writes prefill_peers.json.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks.kernels.bench_attention import B, H, K, N, batch, roofline, time_fn

SEQS, L = 8, 2048


def _timed(name, fn, *args):
    try:
        ts = time_fn(fn, *args)
        return dict(name=name, median_s=statistics.median(ts), repeats=ts)
    except Exception as e:  # a peer that does not compile here is reported
        print(name, "failed:", repr(e)[:800])
        return dict(name=name, error=repr(e)[:800])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxinfer.pallas_kernels import RaggedPagedAttentionTuning, ragged_paged_attention

    roof = roofline()
    flops = 4 * SEQS * (L * (L + 1) // 2) * N * H
    key = jax.random.PRNGKey(0)
    bf16 = jnp.bfloat16
    rows = []

    q, kp, vp, kv_lens, tables, cu, ns = batch([(L, L)] * SEQS, key, bf16)
    in_order = jnp.asarray(1 + np.arange(SEQS * (L // B)).reshape(SEQS, L // B),
                           jnp.int32)
    for block_q, ppb, warps, stages in ((128, 8, 8, 2), (128, 4, 8, 2),
                                        (128, 4, 4, 3), (128, 4, 4, 2),
                                        (64, 4, 4, 3), (128, 8, 4, 2)):
        t = RaggedPagedAttentionTuning(prefill_block_q=block_q,
                                       prefill_pages_per_block=ppb,
                                       prefill_num_warps=warps,
                                       prefill_num_stages=stages)
        fn = jax.jit(functools.partial(ragged_paged_attention, sm_scale=H**-0.5,
                                       tuning=t))
        tag = f"bq{block_q}_pages{ppb}_w{warps}_s{stages}"
        rows.append(_timed(f"ours_random_pages_{tag}", fn, q, kp, vp, kv_lens,
                           tables, cu, ns))
        if (block_q, ppb, warps, stages) == (128, 8, 8, 2):
            rows.append(_timed(f"ours_in_order_pages_{tag}", fn, q, kp, vp,
                               kv_lens, in_order, cu, ns))

    qb = q.reshape(SEQS, L, N, H)
    k1, k2 = jax.random.split(key)
    kb = jax.random.normal(k1, (SEQS, L, K, H), bf16)
    vb = jax.random.normal(k2, (SEQS, L, K, H), bf16)

    from jax.experimental.pallas.ops.gpu import attention as triton_attention
    rep = lambda x: jnp.repeat(x, N // K, axis=2)
    kr, vr = rep(kb), rep(vb)
    for bq, bk, w, st in ((128, 64, 8, 2), (128, 128, 8, 2), (128, 64, 4, 3),
                          (64, 64, 4, 2)):
        sizes = triton_attention.BlockSizes(block_q=bq, block_k=bk)
        fn = jax.jit(functools.partial(
            triton_attention.mha, segment_ids=None, sm_scale=H**-0.5,
            causal=True, block_sizes=sizes, num_warps=w, num_stages=st))
        rows.append(_timed(f"triton_mha_bq{bq}_bk{bk}_w{w}_s{st}", fn, qb, kr, vr))
    del kr, vr

    try:
        from jax.experimental.pallas.ops.gpu import attention_mgpu
        for bq, bk, steps in ((64, 128, 2), (64, 64, 2), (64, 128, 4),
                              (64, 256, 2)):
            cfg = attention_mgpu.TuningConfig(block_q=bq, block_kv=bk,
                                              max_concurrent_steps=steps,
                                              causal=True)
            fn = jax.jit(functools.partial(attention_mgpu.attention, config=cfg))
            # The bundled kernel takes float16 only; same tensor-core rate.
            f16 = [x.astype(jnp.float16) for x in (qb, kb, vb)]
            rows.append(_timed(f"mosaic_attention_mgpu_f16_bq{bq}_bk{bk}_st{steps}",
                               fn, *f16))
    except Exception as e:
        rows.append(dict(name="mosaic_attention_mgpu", error=repr(e)[:800]))

    fn = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=True,
                                   implementation="cudnn"))
    rows.append(_timed("cudnn", fn, qb, kb, vb))

    for r in rows:
        if "median_s" in r:
            r["tflops"] = flops / r["median_s"] / 1e12
            r["frac_of_matmul"] = flops / r["median_s"] / roof["flops"]
    record = dict(
        workload="prefill-peers", seqs=SEQS, L=L, N=N, K=K, H=H, page=B,
        dtype="bfloat16", causal=True, flops=flops,
        matmul_flops_per_s=roof["flops"], copy_bw=roof["bw"],
        device=roof["device"], jax=jax.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prefill_peers.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"matmul {roof['flops'] / 1e12:.0f} TFLOP/s; 8x2048 causal prefill:")
    for r in rows:
        if "median_s" in r:
            print(f"  {r['name']:48s} {r['median_s'] * 1e3:7.3f} ms "
                  f"{r['tflops']:6.0f} TFLOP/s {100 * r['frac_of_matmul']:5.1f}%")
        else:
            print(f"  {r['name']:48s} failed")


if __name__ == "__main__":
    main()
