"""Ragged paged attention on one GPU: correctness, roofline, timings, peers.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/bench_attention.py --out $OUT

1. roofline of this run: torch ``copy_`` of 2 GiB (bytes read + written / time)
   and a torch 8192^3 bf16 matmul;
2. correctness of the compiled kernels against the jnp reference on ragged
   mixes (bf16 and f32, GQA 1/4/8, head dims 64/128/256, pages 16/32, window,
   soft-cap);
3. medians of repeats (random data) on docs/benchmarking.md's shapes: decode S=64
   L=2048 and S=1 L=32768 (N=32 K=8 H=128 page 16 bf16) against JAX's bundled
   Pallas ``paged_attention`` (best of a few configs); prefill 8 x 2048 causal
   against ``jax.nn.dot_product_attention(implementation="cudnn")``; a mixed
   step (4 prefill chunks of 512 + 60 decodes at L=2048) against the sum of its
   parts. A few tuning variants of our kernels are timed; the best is reported.
   Decode batches are timed with ``decode_only=True`` (the engine's call on a
   step of decodes alone) and without it, each twice: per call (back-to-back
   jitted calls, one sync; at S=1 this measures the host's dispatch) and
   chained (16 calls in one program, each output the next call's queries:
   the device time, as inside the engine's step). The bundled kernel gets
   the same two timings. ``--decode-only-run`` stops after the decode half.

Prints a table last; writes kernel-decode.json and kernel-prefill.json to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

N, K, H, B = 32, 8, 128, 16
# BENCH_SMOKE=1: tiny shapes in interpret mode on CPU, to check the script.
SMOKE = os.environ.get("BENCH_SMOKE") == "1"
L_DIV = 32 if SMOKE else 1


def roofline():
    if SMOKE:
        return dict(copy_bytes=0, copy_s=[1.0], bw=1e12, matmul_s=[1.0],
                    flops=1e14, device="cpu-smoke")
    import torch
    x = torch.empty(2**30, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)

    def ev_time(fn, reps):
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return ts
    for _ in range(3):
        y.copy_(x)
    copy_t = ev_time(lambda: y.copy_(x), 20)
    bw = 2 * x.numel() * 2 / statistics.median(copy_t)
    x = y = None  # frees the buffers (the timed closures are done)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    mm_t = ev_time(lambda: a @ b, 10)
    flops = 2 * 8192**3 / statistics.median(mm_t)
    a = b = None
    torch.cuda.empty_cache()
    return dict(copy_bytes=2 * 2**31, copy_s=copy_t, bw=bw, matmul_s=mm_t,
                flops=flops, device=torch.cuda.get_device_name())


def time_fn(fn, *args, repeats=9, min_s=0.03):
    """Median seconds per call: back-to-back calls, then one sync."""
    import jax
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    iters = max(3, min(200, int(min_s / max(time.perf_counter() - t, 1e-6))))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        ts.append((time.perf_counter() - t) / iters)
    return ts


def time_chained(fn, q, *rest, chain=16):
    """Median seconds per call with ``chain`` calls in one program, each
    call's output the next call's queries: the host dispatches once per
    ``chain`` calls, so small kernels are timed on the device as inside the
    engine's step, not behind the per-call dispatch."""
    import jax

    @jax.jit
    def many(q, *rest):
        for _ in range(chain):
            q = fn(q, *rest).astype(q.dtype)
        return q
    return [t / chain for t in time_fn(many, q, *rest)]


def batch(mix, key, dtype, num_q_heads=N, num_kv_heads=K, head_dim=H,
          page_size=B):
    """A real-sized ragged batch generated on device (random, not zeros)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    need = [-(-kv // page_size) for _, kv in mix]
    pages_per_seq = max(need)
    num_pages = sum(need) + 1
    perm = np.random.default_rng(0).permutation(np.arange(1, num_pages))
    tables = np.zeros((len(mix), pages_per_seq), np.int32)
    used = 0
    for s, n in enumerate(need):
        tables[s, :n] = perm[used:used + n]
        used += n
    q_lens = [ql for ql, _ in mix]
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    k1, k2, k3 = jax.random.split(key, 3)
    shape = (num_kv_heads, num_pages, page_size, head_dim)
    q = jax.random.normal(k1, (int(cu[-1]), num_q_heads, head_dim), dtype)
    kp = jax.random.normal(k2, shape, dtype)
    vp = jax.random.normal(k3, shape, dtype)
    return (q, kp, vp, jnp.asarray([kv for _, kv in mix], jnp.int32),
            jnp.asarray(tables), jnp.asarray(cu),
            jnp.asarray([len(mix)], jnp.int32))


def correctness():
    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import ragged_paged_attention, ragged_paged_attention_reference
    from tests.pallas_kernels.cases import TOLERANCE, make_case, rel_error
    mix = [(1, 1), (1, 129), (5, 18), (120, 597), (512, 2048), (1, 5000)]
    rows = []
    for dtype in (jnp.bfloat16, jnp.float32):
        for head_dim, page, group in [(64, 16, 1), (128, 16, 4), (128, 32, 8),
                                      (256, 16, 4), (64, 32, 8)]:
            for kw in ({}, {"sliding_window": 300, "logit_soft_cap": 30.0}):
                case = make_case(mix, num_q_heads=4 * group, num_kv_heads=4,
                                 head_dim=head_dim, page_size=page,
                                 dtype=dtype, seed=len(rows))
                scale = head_dim ** -0.5
                try:
                    out = ragged_paged_attention(*case, sm_scale=scale, **kw)
                except Exception as e:  # record, keep benchmarking
                    print("correctness case failed:", repr(e)[:2000])
                    rows.append(dict(dtype=jnp.dtype(dtype).name, ok=False,
                                     head_dim=head_dim, error=str(e)[:500],
                                     rel_err=float("nan")))
                    continue
                ref = ragged_paged_attention_reference(*case, sm_scale=scale,
                                                       **kw)
                err = rel_error(out, ref)
                ok = err < TOLERANCE[jnp.dtype(dtype)] and bool(
                    jnp.all(jnp.isfinite(out.astype(jnp.float32))))
                rows.append(dict(dtype=jnp.dtype(dtype).name, head_dim=head_dim,
                                 page_size=page, group=group, **kw,
                                 rel_err=err, ok=ok))
    return rows + decode_only_correctness()


def decode_only_correctness():
    """Decode-only steps (the engine's decode_only=True), with the default
    Mosaic decode tuning and the 3-stage, 2-programs-per-SM one."""
    import dataclasses

    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import ragged_paged_attention, ragged_paged_attention_reference
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
        MosaicDecodeTuning,
        default_tuning,
    )
    from tests.pallas_kernels.cases import TOLERANCE, make_case, rel_error
    dec_mix = [(1, 1), (1, 129), (1, 2048 // L_DIV), (1, 5000 // L_DIV), (1, 17)]
    rows = []
    for head_dim, page, group in [(128, 16, 4), (64, 16, 8), (128, 32, 4)]:
        for label, mosaic in [("default", None),
                              ("s3_2psm", MosaicDecodeTuning(
                                  num_stages=3, programs_per_sm=2)),
                              ("t128", MosaicDecodeTuning(
                                  tokens_per_step=128, num_stages=3))]:
            tuning = default_tuning(head_dim, page)
            if mosaic is not None:
                tuning = dataclasses.replace(tuning, mosaic_decode=mosaic)
            case = make_case(dec_mix, num_q_heads=4 * group, num_kv_heads=4,
                             head_dim=head_dim, page_size=page,
                             dtype=jnp.bfloat16, seed=len(rows))
            scale = head_dim ** -0.5
            out = ragged_paged_attention(*case, sm_scale=scale, tuning=tuning,
                                         decode_only=True, interpret=SMOKE)
            ref = ragged_paged_attention_reference(*case, sm_scale=scale)
            err = rel_error(out, ref)
            n_real = int(case[6][0])
            ok = err < TOLERANCE[jnp.dtype(jnp.bfloat16)] and not bool(
                jnp.any(out[n_real:]))
            rows.append(dict(dtype="bfloat16", head_dim=head_dim,
                             page_size=page, group=group, decode_only=True,
                             tuning=label, rel_err=err, ok=ok))
    return rows


def our_variants(kind, fixed=None):
    """(label, tuning, call kwargs): the engine's default tuning (on Hopper:
    the Mosaic GPU kernels where they take the case) and the best
    Triton-lowered tuning of earlier runs, so that one run compares both
    backends. Decode batches are timed twice per tuning: with
    ``decode_only=True``, as the engine calls the kernels on a step of
    decodes alone, and without it, as on a mixed step's decode half."""
    if fixed is not None:
        return [("fixed", fixed, {})]
    import dataclasses

    from jaxinfer.pallas_kernels import RaggedPagedAttentionTuning as T
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
        MosaicDecodeTuning,
        default_tuning,
    )
    if SMOKE:
        tunings = [("default", T()),
                   ("triton", T(decode_pages_per_block=4, prefill_block_q=128,
                                prefill_num_warps=8))]
    elif kind == "decode":
        base = default_tuning(H, B)
        tunings = [
            ("mosaic", base),
            # Three stages, two programs per SM (v4's fastest kernel alone).
            ("mosaic_s3_2psm", dataclasses.replace(
                base, mosaic_decode=MosaicDecodeTuning(num_stages=3,
                                                       programs_per_sm=2))),
            # 128-token steps, 3 stages: half the barrier waits per page.
            ("mosaic_t128", dataclasses.replace(
                base, mosaic_decode=MosaicDecodeTuning(tokens_per_step=128,
                                                       num_stages=3))),
            ("triton", T(decode_backend="triton", decode_pages_per_block=4,
                         decode_prefetch=True))]
    else:
        return [("default", default_tuning(H, B), {}),
                ("triton", T(prefill_backend="triton", prefill_block_q=128,
                             prefill_pages_per_block=8, prefill_num_warps=8),
                 {})]
    if kind != "decode":
        return [(label, t, {}) for label, t in tunings]
    return [(label + suffix, t, kw) for label, t in tunings
            for suffix, kw in (("_decode_only", {"decode_only": True}),
                               ("", {}))]


def time_ours(args, kind, limit=None, fixed=None):
    import functools

    import jax

    from jaxinfer.pallas_kernels import ragged_paged_attention
    res = []
    for label, tuning, kw in our_variants(kind, fixed)[:limit]:
        fn = jax.jit(functools.partial(ragged_paged_attention, sm_scale=H**-0.5,
                                       tuning=tuning, interpret=SMOKE, **kw))
        try:
            ts = time_fn(fn, *args)
        except Exception as e:  # a variant that does not compile is skipped
            print("variant failed:", label, tuning, repr(e)[:2000])
            res.append(dict(label=label, tuning=repr(tuning), error=str(e)[:300]))
            continue
        row = dict(label=label, tuning=repr(tuning), call_kwargs=kw,
                   repeats=ts, median=statistics.median(ts), obj=tuning)
        if kind == "decode" and fixed is None:
            ch = time_chained(fn, *args)
            row.update(chained_repeats=ch, chained_median=statistics.median(ch))
        res.append(row)
    return res


def best(res):
    ok = [r for r in res if "median" in r]
    return min(ok, key=lambda r: r["median"]) if ok else None


def time_bundled(args):
    import functools

    import jax
    from jax.experimental.pallas.ops.gpu import paged_attention as pa
    q, kp, vp, kv_lens, tables, _, _ = args
    pages = tables.shape[1]
    res = []
    for ppcb, splits in [(8, 16), (8, 8), (16, 4), (4, 16), (8, 1), (16, 8)]:
        if pages % splits or (pages // splits) % min(ppcb, pages // splits):
            continue
        fn = jax.jit(functools.partial(pa.paged_attention,
                                       pages_per_compute_block=ppcb,
                                       k_splits=splits, interpret=SMOKE))
        try:
            ts = time_fn(fn, q, kp, vp, tables, kv_lens)
        except Exception as e:
            print("bundled failed:", ppcb, splits, repr(e)[:500])
            res.append(dict(ppcb=ppcb, k_splits=splits, error=str(e)[:300]))
            continue
        res.append(dict(ppcb=ppcb, k_splits=splits, repeats=ts,
                        median=statistics.median(ts), fn=fn))
    # Chained (one dispatch per 16 calls) for its defaults and its best.
    ok = [r for r in res if "median" in r]
    for r in {id(r): r for r in [ok[0], min(ok, key=lambda r: r["median"])]
              if ok}.values():
        ch = time_chained(r["fn"], q, kp, vp, tables, kv_lens)
        r.update(chained_repeats=ch, chained_median=statistics.median(ch))
    for r in res:
        r.pop("fn", None)
    return res


def time_cudnn(q, seqs, seq_len):
    import jax
    qb = q.reshape(seqs, seq_len, N, H)
    kb = jax.random.normal(jax.random.PRNGKey(7), (seqs, seq_len, K, H), q.dtype)
    vb = jax.random.normal(jax.random.PRNGKey(8), (seqs, seq_len, K, H), q.dtype)
    fn = jax.jit(lambda a, b, c: jax.nn.dot_product_attention(
        a, b, c, is_causal=True, scale=H**-0.5,
        implementation=None if SMOKE else "cudnn"))
    try:
        ts = time_fn(fn, qb, kb, vb)
    except Exception as e:
        return dict(error=str(e)[:300], median=float("nan"))
    return dict(repeats=ts, median=statistics.median(ts))


def print_decode(decode):
    for name, d in decode.items():
        print(f"{name}: ours ({d['ours_best_label']}) "
              f"{nz(d['ours_median_s']) * 1e6:.1f} us "
              f"{nz(d['ours_tb_s']):.2f} TB/s = "
              f"{nz(d['frac_of_copy_bw']):.0%} of copy (without decode_only "
              f"{nz(d['general_median_s']) * 1e6:.1f} us = "
              f"{nz(d['general_frac_of_copy_bw']):.0%}); bundled best "
              f"{nz(d['bundled_tb_s']):.2f} TB/s, speedup "
              f"{nz(d['speedup_vs_bundled']):.2f}x; vs bundled defaults "
              f"{nz(d['speedup_vs_bundled_default']):.2f}x")
        print(f"    chained (16 calls per program): ours "
              f"{nz(d['ours_chained_median_s']) * 1e6:.1f} us = "
              f"{nz(d['chained_frac_of_copy_bw']):.0%} of copy; bundled "
              f"{nz(d['bundled_chained_median_s']) * 1e6:.1f} us; speedup "
              f"{nz(d['chained_speedup_vs_bundled']):.2f}x")
        for r in d["ours"]:
            if "median" in r:
                print(f"    {r['label']:28s} {r['median'] * 1e6:8.1f} us  "
                      f"chained {nz(r.get('chained_median')) * 1e6:8.1f} us")


def print_correctness(checks):
    bad = [c for c in checks if not c["ok"]]
    print(f"\ncorrectness: {len(checks) - len(bad)}/{len(checks)} ok; "
          f"worst rel err {max([c['rel_err'] for c in checks] or [0]):.2e}")
    for c in bad:
        print("  FAIL", c)


def nz(x):
    return float("nan") if x is None else x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--correctness-only", action="store_true")
    ap.add_argument("--decode-only-run", action="store_true",
                    help="decode timings alone (no prefill/mixed section)")
    a = ap.parse_args()
    roof = roofline()
    import jax
    import jax.numpy as jnp
    bf16 = jnp.bfloat16
    meta = dict(commit=a.commit, device=roof["device"],
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                jax=jax.__version__, jaxlib=jax.lib.__version__ if hasattr(
                    jax.lib, "__version__") else None,
                bw_bytes_per_s=roof["bw"], matmul_flops_per_s=roof["flops"],
                copy_repeats_s=roof["copy_s"], matmul_repeats_s=roof["matmul_s"])
    checks = ([] if a.skip_correctness else
              decode_only_correctness() if SMOKE else correctness())
    if a.correctness_only:
        bad = [c for c in checks if not c["ok"]]
        print(f"correctness: {len(checks) - len(bad)}/{len(checks)} ok; worst"
              f" rel err {max(c['rel_err'] for c in checks):.2e}", bad)
        return
    key = jax.random.PRNGKey(0)
    decode = {}
    for name, s, l in [("decode_S64_L2048", 64 // L_DIV, 2048 // L_DIV),
                       ("decode_S1_L32768", 1, 32768 // L_DIV)]:
        args = batch([(1, l)] * s, key, bf16)
        kv_bytes = 2 * s * l * K * H * 2
        ours, bundled = time_ours(args, "decode"), time_bundled(args)
        bo, bb = best(ours), best(bundled)
        general = best([r for r in ours if not r.get("call_kwargs")])
        bundled_default = next((r for r in bundled if "median" in r and (
            r["ppcb"], r["k_splits"]) == (8, 16)), None)
        chained = lambda rs: min((r["chained_median"] for r in rs
                                  if "chained_median" in r), default=None)
        oc, bc = chained(ours), chained(bundled)
        decode[name] = dict(
            params=dict(S=s, L=l, N=N, K=K, H=H, page=B, dtype="bfloat16"),
            kv_bytes=kv_bytes, ours=ours, bundled=bundled,
            # Chained timings: 16 calls per program (device-bound).
            ours_chained_median_s=oc, bundled_chained_median_s=bc,
            chained_frac_of_copy_bw=oc and kv_bytes / oc / roof["bw"],
            chained_speedup_vs_bundled=oc and bc and bc / oc,
            ours_best_label=bo and bo["label"],
            # Without decode_only: the decode half of a mixed step.
            general_median_s=general and general["median"],
            general_frac_of_copy_bw=general and kv_bytes / general["median"]
            / roof["bw"],
            # The bundled kernel at its own defaults (8 pages, 16 splits).
            bundled_default_median_s=bundled_default
            and bundled_default["median"],
            speedup_vs_bundled_default=bo and bundled_default
            and bundled_default["median"] / bo["median"],
            ours_median_s=bo and bo["median"],
            bundled_median_s=bb and bb["median"],
            ours_tb_s=bo and kv_bytes / bo["median"] / 1e12,
            bundled_tb_s=bb and kv_bytes / bb["median"] / 1e12,
            frac_of_copy_bw=bo and kv_bytes / bo["median"] / roof["bw"],
            speedup_vs_bundled=bo and bb and bb["median"] / bo["median"])
        del args
    os.makedirs(a.out, exist_ok=True)
    if a.decode_only_run:
        for r in decode.values():
            for v in r["ours"]:
                v.pop("obj", None)
        with open(os.path.join(a.out, "kernel-decode-h200.json"), "w") as f:
            json.dump(dict(meta, workload="kernel-decode", correctness=checks,
                           results=decode), f, indent=1)
        print_correctness(checks)
        print_decode(decode)
        return
    prefill = {}
    pl_len = 2048 // L_DIV
    args = batch([(pl_len, pl_len)] * 8, key, bf16)
    flops = 4 * 8 * (pl_len * (pl_len + 1) // 2) * N * H
    ours = time_ours(args, "prefill")
    cud = time_cudnn(args[0], 8, pl_len)
    bo = best(ours)
    prefill["prefill_8x2048"] = dict(
        params=dict(seqs=8, L=2048, N=N, K=K, H=H, page=B, causal=True,
                    dtype="bfloat16"),
        flops=flops, ours=ours, cudnn=cud,
        ours_median_s=bo and bo["median"], cudnn_median_s=cud["median"],
        ours_tflops=bo and flops / bo["median"] / 1e12,
        cudnn_tflops=flops / cud["median"] / 1e12,
        frac_of_matmul=bo and flops / bo["median"] / roof["flops"],
        ratio_to_cudnn=bo and cud["median"] / bo["median"])
    del args
    parts = {}
    import dataclasses
    best_dec = best(decode["decode_S64_L2048"]["ours"])["obj"]
    combined = dataclasses.replace(best(ours)["obj"], **{
        f.name: getattr(best_dec, f.name) for f in dataclasses.fields(best_dec)
        if f.name.startswith("decode_")})
    c, d, nd = 512 // L_DIV, 2048 // L_DIV, 60 // L_DIV + 1
    for name, mix in [("mixed", [(c, c)] * 4 + [(1, d)] * nd),
                      ("prefill_only", [(c, c)] * 4),
                      ("decode_only", [(1, d)] * nd)]:
        res = time_ours(batch(mix, key, bf16), "prefill", fixed=combined)
        parts[name] = dict(variants=res, median_s=(best(res) or {}).get(
            "median", float("nan")))
    prefill["mixed_4x512_plus_60x2048"] = dict(
        parts=parts, ratio_to_sum=parts["mixed"]["median_s"] / (
            parts["prefill_only"]["median_s"] + parts["decode_only"]["median_s"]))
    for r in [*decode.values(), prefill["prefill_8x2048"], *parts.values()]:
        for v in r.get("ours", r.get("variants", [])):
            v.pop("obj", None)
    prefill["mixed_4x512_plus_60x2048"]["tuning"] = repr(combined)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "kernel-decode-h200.json"), "w") as f:
        json.dump(dict(meta, workload="kernel-decode", correctness=checks,
                       results=decode), f, indent=1)
    with open(os.path.join(a.out, "kernel-prefill-h200.json"), "w") as f:
        json.dump(dict(meta, workload="kernel-prefill", results=prefill), f,
                  indent=1)
    print_correctness(checks)
    print(f"copy BW {roof['bw'] / 1e12:.2f} TB/s, bf16 matmul "
          f"{roof['flops'] / 1e12:.0f} TFLOP/s ({roof['device']})")
    print_decode(decode)
    p = prefill["prefill_8x2048"]
    print(f"prefill 8x2048: ours {nz(p['ours_median_s']) * 1e3:.3f} ms "
          f"{nz(p['ours_tflops']):.0f} TFLOP/s = {nz(p['frac_of_matmul']):.0%}"
          f" of matmul; cudnn {p['cudnn_tflops']:.0f} TFLOP/s; ours/cudnn "
          f"{nz(p['ratio_to_cudnn']):.2f}")
    m = prefill["mixed_4x512_plus_60x2048"]
    print("mixed: " + ", ".join(f"{k} {v['median_s'] * 1e6:.0f} us"
                                for k, v in m["parts"].items())
          + f"; mixed/(sum) {m['ratio_to_sum']:.2f}")


if __name__ == "__main__":
    main()
