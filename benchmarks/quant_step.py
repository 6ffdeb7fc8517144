"""`quant-step` workload: quantized weights and fp8 KV pages on the
llama3-8b shape against bf16, ratios from one run.

One command (GPU machine, repo root; about four minutes on one H200):

    export PYTHONPATH=$PWD
    python3 benchmarks/quant_step.py --out $OUT

``--smoke`` runs every section on tiny shapes on CPU (interpret-mode
kernels) to check the script; ``--sections`` picks some of
check,layers,decode,prefill,kv,bytes (two calls can split the run).

Sections, correctness first:

- check: each quantized method's product against the float product of the
  weights it dequantizes to (fp8: of its e4m3-rounded activations too); the
  two int4 unpackings agree; the fp8 KV writer round-trips a page.
- layers: XLA's own lowering of each method, one MLP's up + down
  projections (4096 -> 14336 -> 4096) chained 8 times in one program, at
  M = 1, 256 and 16384 rows: bf16, int4 (AWQ layout, groups of 128; codes
  unpacked by shift, by bitcast to uint4, stored natively as uint4, and
  the Pallas kernel of pallas_kernels/int4_matmul.py), int8
  (weight-only), fp8 (per tensor W8A8; per channel + per token).
- decode: the engine's jitted decode step (embedding, 32 layers with paged
  attention, lm_head), random weights, S=1 and S=256 at L=1024: bf16, int4
  (AWQ layout; XLA's dequantize-then-dot, and the Pallas kernel), fp8.
  A variant that fails is recorded with its error. Targets: int4 >= 2.5x bf16 at S=1 and >= 1.3x at
  S=256; fp8 >= 1.4x at S=256.
- prefill: 8 x 2048 tokens through the model, bf16 and fp8 (target 1.6x).
- kv: pages of 16 tokens counted in the same memory for bf16 and fp8 pages
  (target 2x), and ragged paged attention decode (S=64, L=2048, N=32, K=8,
  H=128) over fp8 pages with per-page scales: bytes read counted in fp8
  over the measured copy bandwidth (target >= 0.75), bf16 beside it.
- bytes: llama3-8b int4 (AWQ, g128) params on the device (target <= 6 GB).

Writes ``quant-step-<device>.json`` (docs/benchmarking.md's fields: commit,
date, device, jax, params, raw repeats, medians, copy BW, matmul rate, ratios)
and prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["BENCH_SMOKE"] = "1"  # bench_attention's tiny-shape switch

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.decode_step import LLAMA3_8B, TINY, decode_batch, make_step
from benchmarks.kernels.bench_attention import batch, roofline, time_chained, time_fn
from benchmarks.run_stamp import run_stamp
from jaxinfer.models import AttentionMetadata, model_class
from jaxinfer.models.dummy import random_params
from jaxinfer.models.quantization import methods as qm
from jaxinfer.models.quantization.config import QuantizationConfig
from jaxinfer.models.runtime import model_constants, run_model
from jaxinfer.pallas_kernels import kv_cache

VARIANTS = {
    "bf16": None,
    "int4": QuantizationConfig("awq", "awq", qm.GroupedWeights(
        bits=4, group_size=32 if SMOKE else 128, zeros=True)),
    # The same params on the Pallas int4 kernel (what the runner picks on
    # one GPU: methods.with_int4_kernel).
    "int4-pallas": QuantizationConfig("awq", "awq", qm.GroupedWeights(
        bits=4, group_size=32 if SMOKE else 128, zeros=True, kernel="pallas")),
    "int8": QuantizationConfig("int8", "float", qm.Int8Weights()),
    # fp8 quantized at load (resolve.at_load): per-channel weights,
    # per-token activations, the MLP's down-projection input quantized by
    # the Pallas kernel (what the runner picks on one GPU:
    # methods.with_int4_kernel); "fp8-xla" by XLA's own fusions;
    # "fp8-per-tensor" is vLLM's per-tensor W8A8.
    "fp8": QuantizationConfig("fp8", "float", qm.Fp8Weights(
        per_channel=True, activation="per_token",
        gated_kernel="pallas_interpret" if SMOKE else "pallas")),
    "fp8-xla": QuantizationConfig("fp8", "float", qm.Fp8Weights(
        per_channel=True, activation="per_token")),
    "fp8-per-tensor": QuantizationConfig("fp8", "float", qm.Fp8Weights()),
}


# Variants that are another one traced with different module switches of
# models/quantization/methods.py: variant -> (its params' variant, switches).
TRACED_AS = {
    "int4-bitcast": ("int4", {"INT4_UNPACK": "bitcast"}),
    "int4-native-u4": ("int4", {}),  # params stored as uint4 (layers only)
    # The Pallas variant ("int4-pallas": the Mosaic GPU int4 kernel up to
    # int4_matmul.MOSAIC_MAX_ROWS rows on Hopper, Triton above) with each
    # kernel alone.
    "int4-mosaic": ("int4-pallas", {"int4_matmul.MOSAIC_MAX_ROWS": 256}),
    "int4-triton": ("int4-pallas", {"int4_matmul.MOSAIC_MAX_ROWS": 0}),
    # The fp8 dot's result in float32 before the scales (methods.py; the
    # default writes the activations' dtype).
    "fp8-f32out": ("fp8", {"FP8_PRODUCT_DTYPE": "float32"}),
    "fp8-per-tensor-f32out": ("fp8-per-tensor",
                              {"FP8_PRODUCT_DTYPE": "float32"}),
    # The fp8 gated quantizer with several rows per program (v3, NOTES.md:
    # the rows share one load of the column scales).
    "fp8-rows2": ("fp8", {"fp8_gated_quant.ROWS_PER_PROGRAM": 2}),
    "fp8-rows4": ("fp8", {"fp8_gated_quant.ROWS_PER_PROGRAM": 4}),
    "fp8-rows8": ("fp8", {"fp8_gated_quant.ROWS_PER_PROGRAM": 8}),
}


def _switch_target(flag):
    """(module, attribute) of a switch: methods.py's, or int4_matmul's or
    fp8_gated_quant's when the name says so."""
    if flag.startswith("int4_matmul."):
        from jaxinfer.pallas_kernels import int4_matmul as i4
        return i4, flag.split(".", 1)[1]
    if flag.startswith("fp8_gated_quant."):
        from jaxinfer.pallas_kernels import fp8_gated_quant as fgq
        return fgq, flag.split(".", 1)[1]
    return qm, flag


@contextlib.contextmanager
def switches(variant):
    """The module switches a variant is traced with."""
    flags = TRACED_AS.get(variant, (variant, {}))[1]
    old = {k: getattr(*_switch_target(k)) for k in flags}
    for k, v in flags.items():
        setattr(*_switch_target(k), v)
    # The switches are module globals, not part of any jit key: a layer
    # traced under other switches (llama.apply_layer caches its trace by
    # the layer's settings) would be reused as it is. (That is how the
    # first "int4-pallas" rows, then a switch too, timed XLA's program.)
    if flags:
        jax.clear_caches()
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(*_switch_target(k), v)
        if flags:
            jax.clear_caches()


def base_variant(variant):
    return TRACED_AS.get(variant, (variant, {}))[0]


class Layer:
    """What a LinearMethod reads of its Linear module."""
    def __init__(self, n_in, n_out):
        self.in_shape, self.out_shape = (n_in,), (n_out,)
        self.axes = ("embed", "mlp")


def _weights(scheme, n_in, n_out, key):
    """Random params of one layer for ``scheme`` and the float weights they
    dequantize to [n_out, n_in]."""
    k1, k2 = jax.random.split(key)
    if scheme is None:
        w = jax.random.normal(k1, (n_out, n_in), jnp.float32) * 0.02
        return {"w": w.astype(jnp.bfloat16)}, w.astype(jnp.bfloat16).astype(
            jnp.float32)
    if isinstance(scheme, qm.GroupedWeights):
        G = n_in // scheme.group_size
        p = {"qweight": jax.random.bits(k1, (n_out, n_in // 2), jnp.uint8),
             "scales": (jax.random.uniform(k2, (n_out, G)) * 0.004 + 0.001
                        ).astype(jnp.float16),
             "qzeros": jnp.full((n_out, G), 8, jnp.uint8)}
        return p, qm.dequantize_grouped(scheme, p)
    if isinstance(scheme, qm.Int8Weights):
        p = {"weight": jax.random.bits(k1, (n_out, n_in), jnp.uint8).astype(
                 jnp.int8),
             "weight_scale": jnp.full((n_out,), 2e-4, jnp.float32)}
        return p, p["weight"].astype(jnp.float32) * 2e-4
    w = jax.random.normal(k1, (n_out, n_in), jnp.float32).astype(qm.FP8_DTYPE)
    s = (jnp.full((n_out,), 0.02, jnp.float32) if scheme.per_channel
         else jnp.float32(0.02))
    return ({"weight": w, "weight_scale": s},
            w.astype(jnp.float32) * (s[:, None] if s.ndim else s))


def _apply(scheme, layer, p, x):
    if scheme is None:
        return x @ p["w"].T
    return scheme.apply(layer, p, x)


def check(D, F):
    """Correctness of every method's product, before any timing."""
    rows = []
    x = jax.random.normal(jax.random.key(1), (8, D), jnp.float32).astype(
        jnp.bfloat16)
    for name, qc in VARIANTS.items():
        scheme = None if qc is None else qc.scheme
        p, w = _weights(scheme, D, F, jax.random.key(2))
        got = _apply(scheme, Layer(D, F), p, x).astype(jnp.float32)
        xr = x.astype(jnp.float32)
        if isinstance(scheme, qm.Fp8Weights):  # W8A8: the rounded activations
            xq, xs = qm.quantize_activations(xr, scheme.activation)
            xr = xq.astype(jnp.float32) * xs
        want = xr @ w.T
        err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
        rows.append(dict(check=f"product {name}", rel_err=err, ok=err < 2e-2))
    packed = jax.random.bits(jax.random.key(3), (64, 256), jnp.uint8)
    same = bool(jnp.array_equal(qm.unpack_int4(packed, "shift"),
                                qm.unpack_int4(packed, "bitcast")))
    rows.append(dict(check="int4 unpack shift == bitcast", ok=same))
    kp = jnp.zeros((2, 4, 16, 64), jnp.float8_e4m3fn)
    ks = jnp.zeros((2, 4), jnp.float32)
    k = jax.random.normal(jax.random.key(4), (16, 2, 64), jnp.float32)
    kp, _, ks, _ = kv_cache.write_kv_scaled(kp, kp, ks, ks, k, k,
                                            jnp.arange(16, 32), 2)
    back = kp[:, 1].astype(jnp.float32) * ks[:, 1, None, None]
    err = float(jnp.max(jnp.abs(back - k.swapaxes(0, 1)) /
                        (jnp.abs(k.swapaxes(0, 1)) + 0.05)))
    rows.append(dict(check="fp8 KV page round trip", rel_err=err,
                     ok=err < 0.1))
    return rows


LAYER_VARIANTS = ("bf16,int4,int4-bitcast,int4-native-u4,int4-pallas,int8,"
                  "fp8,fp8-per-tensor")


def layers(D, F, Ms, roof, names):
    """XLA's lowering of each method: up + down projections chained."""
    rows = []
    for M in Ms:
        x = jax.random.normal(jax.random.key(5), (M, D), jnp.bfloat16)
        for name in names:
            qc = VARIANTS[base_variant(name)]
            scheme = None if qc is None else qc.scheme
            up, _ = _weights(scheme, D, F, jax.random.key(6))
            down, _ = _weights(scheme, F, D, jax.random.key(7))
            if name == "int4-native-u4":  # XLA's own sub-byte storage
                up, down = ({**p, "qweight": qm.unpack_int4(
                    p["qweight"]).astype(jnp.uint4)} for p in (up, down))

            def chain(x, up, down, scheme=scheme):
                for _ in range(8):
                    h = _apply(scheme, Layer(D, F), up, x)
                    x = _apply(scheme, Layer(F, D), down, h)
                    x = (x * 0.05).astype(jnp.bfloat16)
                return x
            try:
                with switches(name):  # they act while tracing
                    ts = [t / 8 for t in time_fn(jax.jit(chain), x, up, down,
                                                 repeats=5)]
            except Exception as e:  # record it, time the others
                rows.append(dict(section="layers", M=M, variant=name,
                                 error=repr(e)[:800]))
                continue
            nbytes = _nbytes((up, down))
            med = statistics.median(ts)
            rows.append(dict(section="layers", M=M, variant=name,
                             repeats_s=ts, us=med * 1e6,
                             weight_bytes=nbytes,
                             weight_bw_fraction=nbytes / med / roof["bw"],
                             tflops=2 * M * D * F * 2 / med / 1e12))
    for M in Ms:  # ratios against bf16 at the same M
        base = next(r for r in rows if r["M"] == M and r["variant"] == "bf16")
        for r in rows:
            if r["M"] == M and "us" in r:
                r["speedup_vs_bf16"] = base["us"] / r["us"]
    return rows


def _model(cfg, variant, backend):
    qc = VARIANTS[base_variant(variant)]
    cfg = cfg if qc is None else dataclasses.replace(cfg, quantization=qc)
    model = model_class(cfg.architecture)(cfg, backend=backend,
                                          dtype=jnp.bfloat16)
    return cfg, model, random_params(model, cfg, jnp.bfloat16)


def _nbytes(tree):
    """Bytes of the arrays' data (uint4 counted two per byte)."""
    return sum(x.size // 2 if x.dtype == jnp.uint4 else
               x.size * x.dtype.itemsize
               for x in jax.tree_util.tree_leaves(tree))


def decode(cfg, sizes, variants, backend, roof, profile=False):
    rows = []
    for variant in variants:
        qcfg, model, params = _model(cfg, variant, backend)
        constants = model_constants(model, max(L for _, L in sizes))
        step = make_step(model)
        for S, L in sizes:
            kv, md, ids, pos = decode_batch(cfg, S, L, jax.random.key(S + L))
            state = {"kv": kv}

            def run():
                tok, state["kv"] = step(params, state["kv"], constants, ids,
                                        pos, md)
                return tok
            try:
                with switches(variant):  # they act while tracing
                    ts = time_fn(run, repeats=7, min_s=0.05)
            except Exception as e:  # record it, time the others
                rows.append(dict(section="decode", variant=variant, S=S, L=L,
                                 error=repr(e)[:800]))
                continue
            med = statistics.median(ts)
            kv_bytes = S * L * 2 * cfg.num_layers * cfg.num_kv_heads * (
                cfg.head_dim * 2)
            rows.append(dict(section="decode", variant=variant, S=S, L=L,
                             repeats_s=ts, ms=med * 1e3,
                             weight_bytes=_nbytes(params),
                             bytes_over_bw_ms=(_nbytes(params) + kv_bytes)
                             / roof["bw"] * 1e3))
            if profile:  # where the step's time goes
                from benchmarks.step_breakdown import profile_steps
                rows[-1]["profile"] = profile_steps(run, 3)
            kv = state = None
        params = None  # frees the weights before the next variant
    _ratios(rows, ("S", "L"))
    return rows


def prefill(cfg, num_seqs, seq_len, variants, backend, roof,
            profile=False):
    rows = []
    B = 16
    pages = seq_len // B
    tables = (1 + np.arange(num_seqs * pages, dtype=np.int32)).reshape(
        num_seqs, pages)
    T = num_seqs * seq_len
    pos = np.tile(np.arange(seq_len, dtype=np.int32), num_seqs)
    seq = np.repeat(np.arange(num_seqs), seq_len)
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(tables[seq, pos // B] * B + pos % B),
        block_tables=jnp.asarray(tables),
        kv_lens=jnp.full(num_seqs, seq_len, jnp.int32),
        cu_q_lens=jnp.arange(0, T + 1, seq_len, dtype=jnp.int32),
        num_seqs=jnp.array([num_seqs], jnp.int32))
    ids = jax.random.randint(jax.random.key(9), (T,), 0, cfg.vocab_size,
                             jnp.int32)
    last = jnp.arange(seq_len - 1, T, seq_len, dtype=jnp.int32)
    for variant in variants:
        qcfg, model, params = _model(cfg, variant, backend)
        constants = model_constants(model, seq_len)
        kv = kv_cache.init_kv_pages(cfg.num_layers, num_seqs * pages + 1, B,
                                    cfg.num_kv_heads, cfg.head_dim,
                                    jnp.bfloat16)

        @jax.jit
        def fwd(params, kv, model=model, constants=constants):
            logits, _ = run_model(model, params, constants, kv, ids,
                                  jnp.asarray(pos), md, last)
            return logits
        with switches(variant):  # they act while tracing
            ts = time_fn(fwd, params, kv, repeats=5)
        med = statistics.median(ts)
        flops = 2 * cfg.num_params * T
        rows.append(dict(section="prefill", variant=variant,
                         tokens=f"{num_seqs}x{seq_len}", repeats_s=ts,
                         ms=med * 1e3, tflops=flops / med / 1e12,
                         matmul_rate_fraction=flops / med / roof["flops"]))
        if profile:  # where the time goes: kernel groups, top kernels
            from benchmarks.step_breakdown import profile_steps
            rows[-1]["profile"] = profile_steps(lambda: fwd(params, kv), 2)
        params = kv = None
    _ratios(rows, ("tokens",))
    return rows


def _ratios(rows, keys):
    for r in rows:
        base = next(b for b in rows if b["variant"] == "bf16"
                    and all(b[k] == r[k] for k in keys))
        if "ms" in r and "ms" in base:
            r["speedup_vs_bf16"] = base["ms"] / r["ms"]


def kv(cfg, roof, S, L):
    from jaxinfer.pallas_kernels import ragged_paged_attention
    from jaxinfer.worker.kv_dtype import page_bytes
    rows = []
    budget = 40 << 30  # the same memory for both page dtypes
    for name, dt in (("bf16", jnp.bfloat16), ("fp8", jnp.float8_e4m3fn)):
        pb = page_bytes(cfg.num_layers, 16, cfg.num_kv_heads, cfg.head_dim, dt)
        rows.append(dict(section="kv-pages", variant=name, page_bytes=pb,
                         pages_in_40GiB=budget // pb))
    rows[1]["pages_vs_bf16"] = rows[1]["pages_in_40GiB"] / rows[0][
        "pages_in_40GiB"]
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    case = batch([(1, L)] * S, jax.random.key(11), jnp.bfloat16,
                 num_q_heads=N, num_kv_heads=K, head_dim=H)
    q, kp, vp, *md = case
    num_pages = kp.shape[1]
    scales = jax.random.uniform(jax.random.key(12), (2, K, num_pages),
                                minval=0.01, maxval=0.02)
    for name, dt in (("bf16", jnp.bfloat16), ("fp8", jnp.float8_e4m3fn)):
        pages = (kp.astype(dt), vp.astype(dt))
        kw = dict(k_scale=scales[0], v_scale=scales[1]) if name == "fp8" else {}

        def attn(q, kp, vp, *md, kw=kw):
            return ragged_paged_attention(q, kp, vp, *md, sm_scale=H**-0.5,
                                          decode_only=True, interpret=SMOKE,
                                          **kw)
        ts = time_chained(attn, q, *pages, *md)
        med = statistics.median(ts)
        nbytes = S * L * 2 * K * H * jnp.dtype(dt).itemsize
        if name == "fp8":
            nbytes += S * (L // 16) * 2 * K * 4  # the per-page scales
        rows.append(dict(section="kv-decode-attention", variant=name, S=S,
                         L=L, repeats_s=ts, us=med * 1e6, bytes=nbytes,
                         copy_bw_fraction=nbytes / med / roof["bw"]))
    return rows


def param_bytes(cfg):
    qcfg, model, params = _model(cfg, "int4", "reference")
    jax.block_until_ready(params)
    total = _nbytes(params)
    stats = jax.local_devices()[0].memory_stats() or {}
    return [dict(section="bytes", variant="int4", param_bytes=total,
                 param_gb=total / 1e9,
                 device_bytes_in_use=stats.get("bytes_in_use"))]


def install_int4_tunings(path: str) -> dict:
    """Makes the int4 kernel's default tuning the fastest one timed in
    ``path`` (bench_int4.py's int4-kernel.json) for each (In, Out, M) it
    holds; other shapes keep the built-in default. Returns the table."""
    from jaxinfer.pallas_kernels import int4_matmul as i4
    best: dict = {}
    for one in path.split(","):  # several runs' files: the best of all
        with open(one) as f:
            data = json.load(f)
        for r in data["rows"]:
            if r["variant"] == "kernel" and "us" in r:
                key = (r["In"], r["Out"], r["M"])
                if key not in best or r["us"] < best[key]["us"]:
                    best[key] = r
    builtin = i4.default_tuning
    group = data["group_size"]

    fields = {f.name for f in dataclasses.fields(i4.Int4MatmulTuning)}

    def pick(M, n_out, groups):
        hit = best.get((groups * group, n_out, M))
        if hit is None:
            return builtin(M, n_out, groups)
        return i4.Int4MatmulTuning(**{k: v for k, v in hit["tuning"].items()
                                      if k in fields})
    i4.default_tuning = pick
    return {f"{k[0]}x{k[1]} M={k[2]}": v["tuning"] for k, v in best.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--sections", default="check,layers,decode,prefill,kv,bytes")
    ap.add_argument("--decode-variants", default="bf16,int4,int4-pallas,fp8",
                    help="the decode section's variants, comma-separated")
    ap.add_argument("--layer-variants", default=LAYER_VARIANTS,
                    help="the layers section's variants (bf16 first)")
    ap.add_argument("--prefill-variants", default="bf16,fp8",
                    help="the prefill section's variants, comma-separated")
    ap.add_argument("--profile-decode", action="store_true",
                    help="also profile each decode variant and size")
    ap.add_argument("--profile-prefill", action="store_true",
                    help="also profile each prefill variant (kernel groups "
                    "and the top kernels by time)")
    ap.add_argument("--int4-tuning", default=None,
                    help="bench_int4.py's int4-kernel.json (or several, "
                    "comma-separated): the Pallas int4 variants take the "
                    "fastest tuning timed per shape")
    args = ap.parse_args()
    known = set(VARIANTS) | set(TRACED_AS)
    for flag in ("decode_variants", "layer_variants", "prefill_variants"):
        names = getattr(args, flag).split(",")
        unknown = [n for n in names if n not in known]
        if unknown:
            ap.error(f"--{flag.replace('_', '-')}: unknown variant(s) "
                     f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "bf16" not in names:
            ap.error(f"--{flag.replace('_', '-')} needs bf16 (the ratios' "
                     "base)")
    sections = args.sections.split(",")
    int4_tunings = (install_int4_tunings(args.int4_tuning)
                    if args.int4_tuning else None)
    cfg = TINY if SMOKE else LLAMA3_8B
    backend = "pallas_interpret" if SMOKE else "pallas"
    roof = roofline()
    D, F = cfg.hidden_size, cfg.intermediate_size
    rows = []
    if "check" in sections:
        rows += check(D, F)
        bad = [r for r in rows if not r["ok"]]
        if bad:
            print("correctness failed:", bad)
    if "bytes" in sections:
        rows += param_bytes(cfg)
    if "layers" in sections:
        rows += layers(D, F, [1, 16] if SMOKE else [1, 256, 16384], roof,
                       args.layer_variants.split(","))
    if "kv" in sections:
        rows += kv(cfg, roof, *((4, 64) if SMOKE else (64, 2048)))
    if "decode" in sections:
        rows += decode(cfg, [(1, 64), (4, 64)] if SMOKE else
                       [(1, 1024), (256, 1024)],
                       tuple(args.decode_variants.split(",")), backend, roof,
                       profile=args.profile_decode)
    if "prefill" in sections:
        rows += prefill(cfg, *((2, 32) if SMOKE else (8, 2048)),
                        tuple(args.prefill_variants.split(",")), backend,
                        roof, profile=args.profile_prefill)
    result = dict(
        workload="quant-step", model="tiny" if SMOKE else "llama3-8b",
        backend=backend, **run_stamp(), device=roof["device"], jax=jax.__version__,
        jaxlib=__import__("jaxlib").__version__, int4_unpack=qm.INT4_UNPACK,
        bw_bytes_per_s=roof["bw"], matmul_flops_per_s=roof["flops"],
        copy_s=roof["copy_s"], matmul_s=roof["matmul_s"],
        int4_tunings=int4_tunings, command="python3 benchmarks/quant_step.py "
        + " ".join(sys.argv[1:]), rows=rows)
    device = roof["device"].lower().replace(" ", "-")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"quant-step-{device}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}; BW {roof['bw'] / 1e12:.2f} TB/s, matmul "
          f"{roof['flops'] / 1e12:.0f} TFLOP/s")
    for r in rows:
        shown = {k: (f"{v:.3g}" if isinstance(v, float) else v)
                 for k, v in r.items() if k not in ("repeats_s", "profile")}
        print("  ".join(f"{k}={v}" for k, v in shown.items()))


if __name__ == "__main__":
    main()
