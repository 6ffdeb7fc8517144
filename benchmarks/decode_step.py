"""`decode-step` workload (docs/benchmarking.md): one decode step of a real model
shape with random weights, against the roofline measured in the same run.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/decode_step.py --out $OUT

For each (S, L): S sequences, each with L tokens already in a random (not
zero) KV pool, decode one token each: the engine's own jitted step
(embedding -> 32 layers with paged attention -> lm_head -> sampler), the pool
donated. Medians of repeats after warm-up. The roofline is
``max(bytes / BW, 2 * params * S / FLOPS)`` with
``bytes = weight bytes + S * L * kv_bytes_per_token``; BW and FLOPS are
torch's copy_ and 8192^3 bf16 matmul in this run. Also times the sampler
alone with every feature on (S=256, V=128256) to compare with the step.

The model is the engine's on this platform: one q/k/v weight per layer on
GPU (``models/fused_qkv.py``). ``--variants`` times other forms in the
same run: ``fused_qkv:true`` / ``fused_qkv:false`` choose the model's form
(each form's weights are drawn once and dropped before the next; both
forms hold the same values), e.g.
``--variants 'separate=fused_qkv:false;fused=fused_qkv:true'``.

BENCH_SMOKE=1 runs a tiny shape on CPU to check the script.
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

from benchmarks.kernels.bench_attention import roofline, time_fn
from benchmarks.run_stamp import run_stamp
from jaxinfer.models import AttentionMetadata, ModelConfig, model_class
from jaxinfer.models.dummy import random_params
from jaxinfer.models.fused_qkv import with_fused_qkv
from jaxinfer.models.runtime import model_constants, run_model

SMOKE = os.environ.get("BENCH_SMOKE") == "1"
BLOCK = 16

LLAMA3_8B = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
    intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
    head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_theta=500000.0)
TINY = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=512, hidden_size=64,
    intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=32, max_position_embeddings=512)


def decode_batch(cfg: ModelConfig, S: int, L: int, key, T: int | None = None):
    """A random page pool and the metadata of one decode step; ``T`` > S
    token rows pads the step with rows aimed at the null page (the engine
    pads a lone decode row to 16 on the GPU)."""
    T = T or S
    pages_per_seq = L // BLOCK
    num_pages = S * pages_per_seq + 1  # + the null page
    shape = (cfg.num_kv_heads, num_pages, BLOCK, cfg.head_dim)
    keys = jax.random.split(key, 2 * cfg.num_layers)
    kv = [(jax.random.normal(keys[2 * i], shape, jnp.bfloat16),
           jax.random.normal(keys[2 * i + 1], shape, jnp.bfloat16))
          for i in range(cfg.num_layers)]
    tables = (1 + np.arange(S * pages_per_seq, dtype=np.int32)).reshape(S, -1)
    pos = L - 1  # the new token's position; its slot is in the last page
    slots = np.zeros(T, np.int32)  # padding rows -> the null page
    slots[:S] = tables[:, -1] * BLOCK + pos % BLOCK
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(slots),
        block_tables=jnp.asarray(tables), kv_lens=jnp.full(S, L, jnp.int32),
        cu_q_lens=jnp.arange(S + 1, dtype=jnp.int32),
        num_seqs=jnp.array([S], jnp.int32),
        decode_only=True)  # as the engine marks a step of decodes alone
    ids = jax.random.randint(key, (T,), 0, cfg.vocab_size, jnp.int32)
    return kv, md, ids, jnp.full(T, pos, jnp.int32)


def build(cfg: ModelConfig, backend: str, max_len: int, compiler_options=None):
    """The model with random bf16 weights, its constants and the jitted
    step: (model, params, constants, step)."""
    model = model_class(cfg.architecture)(cfg, backend=backend, dtype=jnp.bfloat16)
    params = random_params(model, cfg, jnp.bfloat16)
    return (model, params, model_constants(model, max_len),
            make_step(model, compiler_options))


def step_caller(step, params, constants, cfg: ModelConfig, S: int, L: int,
                T: int | None = None):
    """A no-argument call of the step on a random pool at (S, L) (T token
    rows, default S), the pool donated and carried from call to call; also
    its (ids, pos, md)."""
    kv, md, ids, pos = decode_batch(cfg, S, L, jax.random.key(S * 7 + L), T)
    state = {"kv": kv}

    def run():
        tok, state["kv"] = step(params, state["kv"], constants, ids, pos, md)
        return tok
    return run, state, (ids, pos, md)


def make_step(model, compiler_options=None):
    def step(params, kv, constants, ids, positions, md):
        logits, kv = run_model(model, params, constants, kv, ids, positions, md,
                               jnp.arange(md.kv_lens.shape[0], dtype=jnp.int32))
        return jnp.argmax(logits, axis=-1), kv
    return jax.jit(step, donate_argnums=(1,), compiler_options=compiler_options)


# Variant options that choose the model's form rather than an XLA option.
MODEL_OPTIONS = ("fused_qkv",)


def parse_variants(spec: str) -> dict:
    """``name=opt:value+opt:value;name2=...`` -> {name: {opt: value}}: XLA
    debug options per variant of the step (``default`` has none),
    ``backend:NAME``, the variant's attention backend (default
    ``--backend``), and ``fused_qkv:true|false`` (MODEL_OPTIONS), its
    q/k/v weight's form (default: the engine's on this platform)."""
    out = {}
    for part in filter(None, spec.split(";")):
        name, _, opts = part.partition("=")
        kv = {}
        for o in filter(None, opts.split("+")):
            k, _, v = o.partition(":")
            kv[k] = {"true": True, "false": False}.get(v, v)
        out[name] = kv
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--backend", default=None, help="attention backend")
    ap.add_argument("--sizes", default="1:1024,64:1024,256:1024,64:2048",
                    help="S:L or S:L:T (T token rows, S of them real)")
    ap.add_argument("--variants", default="default=",
                    help="XLA options per variant, e.g. 'default=;nomerge="
                         "xla_disable_hlo_passes:dot-merger'; backend:NAME "
                         "gives a variant its own attention backend, e.g. "
                         "'fused=;xla_rope=backend:pallas_xla_rope'; "
                         "fused_qkv:true/false picks the q/k/v weight's form")
    args = ap.parse_args()
    variants = parse_variants(args.variants)
    cfg = TINY if SMOKE else LLAMA3_8B
    sizes = [(*map(int, s.split(":")), None)[:3] for s in args.sizes.split(",")]
    if SMOKE:
        sizes = [(2, 64, None), (1, 128, 4)]
    roof = roofline()
    backend = args.backend or ("pallas_interpret" if SMOKE else "pallas")
    cfg = with_fused_qkv(cfg, jax.default_backend())  # the engine's form
    # Variants grouped by the model form they run: {form: [(name, options)]}.
    forms: dict[tuple, list] = {}
    for vname, opts in variants.items():
        form = tuple((k, opts[k]) for k in MODEL_OPTIONS if k in opts)
        forms.setdefault(form, []).append(
            (vname, {k: v for k, v in opts.items() if k not in MODEL_OPTIONS}))
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    rows = []
    for form, members in forms.items():
        fcfg = dataclasses.replace(cfg, **dict(form))
        model, params, constants, _ = build(fcfg, backend,
                                            max(L for _, L, _ in sizes))
        weight_bytes = sum(x.size * x.dtype.itemsize
                           for x in jax.tree_util.tree_leaves(params))
        for S, L, T in sizes:
            for vname, opts in members:
                opts = dict(opts)
                vbackend = opts.pop("backend", backend)
                vmodel = (model if vbackend == backend else model_class(
                    fcfg.architecture)(fcfg, backend=vbackend,
                                       dtype=jnp.bfloat16))
                step = make_step(vmodel, opts or None)
                run, state, _ = step_caller(step, params, constants, fcfg, S,
                                            L, T)
                ts = time_fn(run, repeats=7, min_s=0.05)
                med = statistics.median(ts)
                # The variants' greedy tokens side by side (the pool carried
                # through the timing holds the same values every call).
                tokens = np.asarray(run()).tolist()
                first = next((r for r in rows if (r["S"], r["L"], r["T"]) ==
                              (S, L, T or S)), None)
                nbytes = weight_bytes + S * L * kv_per_token
                t_min = max(nbytes / roof["bw"],
                            2 * cfg.num_params * S / roof["flops"])
                rows.append(dict(
                    S=S, L=L, T=T or S, variant=vname, backend=vbackend,
                    fused_qkv=fcfg.fused_qkv, xla_options=opts,
                    ms=med * 1e3, repeats_s=ts, bytes=nbytes,
                    t_min_ms=t_min * 1e3, roofline_fraction=t_min / med,
                    tokens=tokens,
                    same_tokens_as_first=(None if first is None else float(
                        np.mean(np.equal(tokens, first["tokens"]))))))
                del state, run, step
        del model, params, constants
    rows.sort(key=lambda r: (sizes.index(next(s for s in sizes if (
        s[0], s[1], s[2] or s[0]) == (r["S"], r["L"], r["T"]))),
        list(variants).index(r["variant"])))
    result = dict(
        workload="decode-step", model="llama3-8b" if not SMOKE else "tiny",
        backend=backend, **run_stamp(),
        device=roof["device"], jax=jax.__version__,
        jaxlib=__import__("jaxlib").__version__,
        weight_bytes=weight_bytes, kv_bytes_per_token=kv_per_token,
        bw_bytes_per_s=roof["bw"], matmul_flops_per_s=roof["flops"],
        copy_s=roof["copy_s"], matmul_s=roof["matmul_s"], rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode-step.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"BW {roof['bw'] / 1e12:.2f} TB/s, matmul {roof['flops'] / 1e12:.0f} "
          f"TFLOP/s, weights {weight_bytes / 1e9:.1f} GB, backend {backend}")
    print(f"{'S':>5} {'L':>6} {'T':>5} {'variant':>12} {'ms/step':>9} "
          f"{'t_min ms':>9} {'roofline':>9} {'same tokens':>11}")
    for r in rows:
        same = r["same_tokens_as_first"]
        print(f"{r['S']:>5} {r['L']:>6} {r['T']:>5} {r['variant']:>12} {r['ms']:>9.2f} "
              f"{r['t_min_ms']:>9.2f} {r['roofline_fraction']:>9.2f} "
              f"{'' if same is None else f'{same:.2f}':>11}")


if __name__ == "__main__":
    main()
