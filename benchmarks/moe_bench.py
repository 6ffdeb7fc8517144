"""Mixture-of-experts benchmarks (random bf16 weights), one command:

    export PYTHONPATH=$PWD
    python3 benchmarks/moe_bench.py --out $OUT        # GPU machine, one H200
    python3 benchmarks/moe_bench.py --tiny --out /tmp # CPU check of the script

Two parts, written to ``moe-bench.json``:

- ``decode``: one decode step of the Mixtral-8x7B shape
  (benchmarks/models/mixtral-8x7b) at S sequences of L cached tokens, the
  engine's jitted step as ``decode_step.py`` builds it, against its
  roofline counting only the experts the batch touches:
  ``max(bytes / BW, 2 * active_params * S / FLOPS)`` with ``bytes`` = the
  non-expert weights + the touched experts' weights + the KV read, and
  ``active_params`` the non-expert params + k experts' per token. The
  touched experts per layer are counted from the routing of the step's own
  hidden rows (the first layer's router on the embedded tokens), not
  assumed. ``--num-layers`` cuts the model (and its roofline) for a GPU
  that cannot hold all of it.
- ``grouped``: one layer's experts at S tokens, the grouped product
  (``models.moe.grouped_experts``: the grouped-matmul kernel on a GPU)
  against the dense loop over every expert (``dense_experts_reference``)
  and against ``jax.lax.ragged_dot``, each jitted alone, and the same
  product on 4-bit codes (``int4_*``: AWQ / GPTQ experts); with
  ``--sweep``, the kernel's tunings too (``grouped.tunings``).

BW and FLOPS are measured in the same run (torch's copy_ and an 8192^3
bf16 matmul, ``benchmarks/kernels/bench_attention.roofline``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.decode_step import build, step_caller
from benchmarks.kernels.bench_attention import time_fn
from benchmarks.run_stamp import run_stamp
from jaxinfer.models.config import load_hf_config, model_config_from_hf
from jaxinfer.models.moe import (
    MoEConfig,
    dense_experts_reference,
    experts_impl,
    grouped_experts,
    route,
)
from jaxinfer.models.moe_weights import expert_floats
from jaxinfer.pallas_kernels.grouped_matmul import Int4Weights

HERE = os.path.dirname(os.path.abspath(__file__))
MIXTRAL = os.path.join(HERE, "models", "mixtral-8x7b")

TINY_HF = {
    "architectures": ["MixtralForCausalLM"], "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def _roofline(tiny: bool) -> dict:
    if tiny:  # no GPU: placeholder rates, the fractions mean nothing
        return dict(copy_s=[1.0], bw=1e12, matmul_s=[1.0], flops=1e14,
                    device="cpu-tiny")
    from benchmarks.kernels.bench_attention import roofline
    return roofline()


def _expert_bytes(cfg: MoEConfig) -> int:
    """bf16 bytes of one expert's three projections."""
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size * 2


def _touched_experts(params: dict, ids: jax.Array, cfg: MoEConfig) -> int:
    """Distinct experts the step's tokens route to in the first layer
    (its router over the tokens' embeddings, as a stand-in for every
    layer: random weights route every layer alike in distribution)."""
    x = jnp.take(params["embedding"], ids, axis=0)
    router = params["layers_0"]["mlp"]["router"]
    _, experts = route(x @ router, cfg.num_experts_per_tok,
                       cfg.norm_topk_prob)
    return int(np.unique(np.asarray(experts)).size)


def bench_decode(cfg: MoEConfig, sizes, roof: dict, backend: str) -> list:
    model, params, constants, step = build(cfg, backend,
                                           max(L for _, L in sizes))
    leaves = jax.tree_util.tree_leaves_with_path(params)
    expert_keys = ("gate_proj", "up_proj", "down_proj")
    expert_bytes = sum(x.size * x.dtype.itemsize for p, x in leaves
                       if getattr(p[-1], "key", None) in expert_keys)
    other_bytes = sum(x.size * x.dtype.itemsize for _, x in leaves
                      ) - expert_bytes
    per_expert = _expert_bytes(cfg)
    L_layers = cfg.num_layers
    active = (other_bytes // 2 + L_layers * cfg.num_experts_per_tok
              * per_expert // 2)  # params a token runs through
    kv_per_token = 2 * L_layers * cfg.num_kv_heads * cfg.head_dim * 2
    rows = []
    for S, L in sizes:
        run, state, (ids, _, _) = step_caller(step, params, constants, cfg,
                                              S, L)
        touched = _touched_experts(params, ids, cfg)
        ts = time_fn(run, repeats=7, min_s=0.05)
        med = statistics.median(ts)
        nbytes = (other_bytes + L_layers * touched * per_expert
                  + S * L * kv_per_token)
        t_min = max(nbytes / roof["bw"], 2 * active * S / roof["flops"])
        rows.append(dict(S=S, L=L, ms=med * 1e3, repeats_s=ts,
                         touched_experts_per_layer=touched, bytes=nbytes,
                         t_min_ms=t_min * 1e3,
                         roofline_fraction=t_min / med))
        del run, state
    return rows


SWEEP = [(16, 64, 64, 4, 3), (16, 128, 64, 4, 3), (16, 128, 128, 8, 3),
         (64, 128, 64, 4, 3), (64, 128, 64, 8, 4), (64, 64, 64, 4, 4),
         (128, 128, 64, 8, 3), (32, 128, 64, 4, 4)]


def bench_tunings(args: tuple, act) -> list:
    """The kernel path of grouped_experts under each tuning of SWEEP
    (block_m, block_n, block_k, warps, stages) for both projections."""
    from jaxinfer.models import moe
    from jaxinfer.pallas_kernels import grouped_matmul as gm
    rows = []
    real = gm.default_tuning
    for bm, bn, bk, warps, stages in SWEEP:
        t = gm.GroupedMatmulTuning(bm, bn, bk, warps, stages)
        gm.default_tuning = lambda P, K, N, G=1, q=None, t=t: dataclasses.replace(
            t, block_n=min(t.block_n, gm._block(N, t.block_n)),
            block_k=min(t.block_k, gm._block(q or K, t.block_k)))
        try:
            fn = jax.jit(lambda *a: moe.grouped_experts(*a, act, impl="pallas"))
            ms = statistics.median(time_fn(fn, *args)) * 1e3
            rows.append(dict(block_m=bm, block_n=bn, block_k=bk,
                             num_warps=warps, num_stages=stages, ms=ms))
        except Exception as e:  # a tuning that fails to build
            rows.append(dict(block_m=bm, block_n=bn, block_k=bk,
                             num_warps=warps, num_stages=stages,
                             error=str(e)[:300]))
        finally:
            gm.default_tuning = real
    return rows


def bench_grouped(cfg: MoEConfig, S: int, sweep: bool = False) -> dict:
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (S, D), jnp.bfloat16)
    gate = (jax.random.normal(keys[1], (E, D, F), jnp.bfloat16) * 0.02)
    up = (jax.random.normal(keys[2], (E, D, F), jnp.bfloat16) * 0.02)
    down = (jax.random.normal(keys[3], (E, F, D), jnp.bfloat16) * 0.02)
    weights, experts = route(jax.random.normal(keys[4], (S, E)),
                             cfg.num_experts_per_tok, True)
    act = jax.nn.silu
    grouped = jax.jit(lambda *a: grouped_experts(*a, act))
    ragged = jax.jit(lambda *a: grouped_experts(*a, act, impl="ragged_dot"))
    dense = jax.jit(lambda *a: dense_experts_reference(*a, act))
    args = (x, weights, experts, gate, up, down)
    want = dense(*args)
    err = float(jnp.max(jnp.abs(grouped(*args) - want)))
    scale = float(jnp.max(jnp.abs(want)))
    t_grouped = statistics.median(time_fn(grouped, *args))
    t_ragged = statistics.median(time_fn(ragged, *args))
    t_dense = statistics.median(time_fn(dense, *args))
    # The bytes the grouped product must read: every expert the tokens
    # touch, once (bf16).
    touched = int(np.unique(np.asarray(experts)).size)
    out = dict(S=S, impl=experts_impl(), grouped_ms=t_grouped * 1e3,
               ragged_dot_ms=t_ragged * 1e3, dense_loop_ms=t_dense * 1e3,
               speedup=t_dense / t_grouped, max_abs_diff=err,
               max_abs_ref=scale, touched_experts=touched,
               weight_bytes=touched * _expert_bytes(cfg))
    # The same experts as 4-bit codes (AWQ / GPTQ layout, 128-input scale
    # groups): a quarter of the bytes.
    int4 = tuple(_int4_experts(k, w) for k, w in
                 zip(jax.random.split(keys[4], 3), (gate, up, down)))
    int4_args = (x, weights, experts, *int4)
    err4 = float(jnp.max(jnp.abs(grouped(*int4_args) - dense(
        x, weights, experts, *(expert_floats(w, jnp.bfloat16) for w in int4)))))
    t_int4 = statistics.median(time_fn(grouped, *int4_args))
    out.update(int4_grouped_ms=t_int4 * 1e3, int4_max_abs_diff=err4,
               int4_speedup_over_bf16=t_grouped / t_int4)
    if sweep:
        out["tunings"] = bench_tunings(args, act)
    return out


def _int4_experts(key, w: jax.Array) -> Int4Weights:
    """Random 4-bit codes of w's shape [E, K, N] (scales near w's), in
    groups of 128 inputs (32 where 128 does not divide K)."""
    E, K, N = w.shape
    group = 128 if K % 128 == 0 else 32
    ks = jax.random.split(key, 2)
    packed = jax.random.randint(ks[0], (E, K // 2, N), 0, 256).astype(jnp.uint8)
    scales = jnp.full((E, K // group, N), 0.003, jnp.bfloat16)
    zeros = jax.random.randint(ks[1], (E, K // group, N), 7, 9).astype(jnp.uint8)
    return Int4Weights(packed, scales, zeros)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny Mixtral on CPU: checks the script only")
    ap.add_argument("--backend", default=None, help="attention backend")
    ap.add_argument("--sizes", default="64:1024", help="S:L,...")
    ap.add_argument("--grouped-tokens", type=int, default=256)
    ap.add_argument("--sweep", action="store_true",
                    help="also time the grouped kernel's tunings")
    ap.add_argument("--num-layers", type=int, default=None,
                    help="decoder layers to build (default: the model's)")
    args = ap.parse_args()
    hf = TINY_HF if args.tiny else load_hf_config(MIXTRAL)
    cfg = model_config_from_hf(hf)
    assert isinstance(cfg, MoEConfig)
    if args.num_layers:
        cfg = dataclasses.replace(cfg, num_layers=args.num_layers)
    sizes = [tuple(map(int, s.split(":"))) for s in args.sizes.split(",")]
    if args.tiny:
        sizes = [(4, 64)]
    backend = args.backend or ("reference" if args.tiny else "pallas")
    roof = _roofline(args.tiny)
    decode = bench_decode(cfg, sizes, roof, backend)
    grouped = bench_grouped(cfg, 16 if args.tiny else args.grouped_tokens,
                            args.sweep)
    result = dict(
        workload="moe", model="tiny-mixtral" if args.tiny else "mixtral-8x7b",
        num_layers=cfg.num_layers, backend=backend, **run_stamp(),
        device=roof["device"], jax=jax.__version__,
        bw_bytes_per_s=roof["bw"], matmul_flops_per_s=roof["flops"],
        decode=decode, grouped=grouped)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe-bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in decode:
        print(f"decode S={r['S']} L={r['L']}: {r['ms']:.2f} ms, roofline "
              f"{r['t_min_ms']:.2f} ms ({r['roofline_fraction']:.2f}), "
              f"{r['touched_experts_per_layer']} experts touched per layer")
    g = grouped
    print(f"experts S={g['S']}: grouped ({g['impl']}) {g['grouped_ms']:.3f} ms, "
          f"ragged_dot {g['ragged_dot_ms']:.3f} ms, dense loop "
          f"{g['dense_loop_ms']:.3f} ms ({g['speedup']:.2f}x), max |diff| "
          f"{g['max_abs_diff']:.2e} of {g['max_abs_ref']:.2e}; int4 "
          f"{g['int4_grouped_ms']:.3f} ms ({g['int4_speedup_over_bf16']:.2f}x "
          f"the bf16 grouped product)")
    for t in g.get("tunings", []):
        print(f"  tuning {t}")


if __name__ == "__main__":
    main()
