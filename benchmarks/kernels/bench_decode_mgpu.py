"""Mosaic GPU decode kernel against the Triton one and the copy bandwidth.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/bench_decode_mgpu.py --out $OUT

1. copy bandwidth of this run (torch ``copy_`` of 2 GiB, read + written);
2. correctness of the public ``ragged_paged_attention`` with the Mosaic decode
   kernel (automatic backend) against the jnp reference on ragged mixes (GQA
   1/4/8, head dims 64/128/256, pages 16/32, window + soft-cap, k/v scales);
3. medians of repeats on the issue's decode shapes (S=64 L=2048 and S=1
   L=32768, N=32 K=8 H=128 page 16 bf16): the public API with the Triton
   decode kernel (tuned table) and with Mosaic tuning variants, and the Mosaic
   kernel alone (no wrapper: q gather, prefill launch, output scatter).

Prints a table last; writes kernel-decode-mgpu-h200.json to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import statistics
import sys
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks.kernels.bench_attention import batch, roofline, time_fn

N, K, H, B = 32, 8, 128, 16
COMMAND = ("export PYTHONPATH=$PWD; "
           "python3 benchmarks/kernels/bench_decode_mgpu.py --out $OUT")
_first_error = [True]


def report_error(what, e):
    text = "".join(traceback.format_exception(e))
    if _first_error[0]:
        print(f"{what} FAILED:\n{text[-5000:]}", flush=True)
        _first_error[0] = False
    else:
        print(f"{what} FAILED: {repr(e)[:400]}", flush=True)
    return text[-3000:]


CONFIGS = [(128, 16, 4), (64, 16, 1), (128, 32, 8), (256, 16, 4),
           (64, 32, 8), (128, 32, 4), (128, 16, 8)]
# Mosaic tuning variants checked for correctness (the default on every
# config, the others on the first three).
CHECKED = {"default": {}, "no_auto_barriers": {"no_auto_barriers": True}}


def check_config(index, variant):
    """One (head_dim, page, group) config, all its feature cases; run in a
    subprocess so that a kernel fault names its config and spares the rest.
    Stages: the Mosaic kernel alone, then the public API (tuned table with
    the Mosaic decode kernel), then the reference."""
    import jax
    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import ragged_paged_attention, ragged_paged_attention_reference
    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
        MosaicDecodeTuning,
        default_tuning,
    )
    from tests.pallas_kernels.cases import TOLERANCE, make_case, rel_error
    head_dim, page, group = CONFIGS[index]
    mix = [(1, 1), (1, 64), (1, 129), (5, 18), (1, 2048), (120, 597),
           (1, 5000)]
    tuning = dataclasses.replace(
        default_tuning(head_dim, page), decode_backend="mosaic",
        mosaic_decode=MosaicDecodeTuning(**CHECKED[variant]))
    extra = [{"k_scale": 0.5, "v_scale": 1.5}] if group == 4 else []
    rows = []
    for kw in ({}, {"sliding_window": 300, "logit_soft_cap": 30.0}, *extra):
        case = make_case(mix, num_q_heads=4 * group, num_kv_heads=4,
                         head_dim=head_dim, page_size=page,
                         dtype=jnp.bfloat16, seed=len(rows) + 10 * index)
        scale = head_dim ** -0.5
        name = dict(head_dim=head_dim, page_size=page, group=group,
                    mosaic=variant, **kw)
        stage = "mosaic kernel alone"
        try:
            q, kp, vp, kv_lens, tables, cu, ns = case
            s = tables.shape[0]
            lens = jnp.where((cu[1:] - cu[:-1] == 1)
                             & (jnp.arange(s) < ns[0]), kv_lens, 0)
            jax.block_until_ready(mg.decode_attention(
                q[jnp.minimum(cu[:-1], q.shape[0] - 1)].reshape(
                    s, 4, group, head_dim), kp, vp, lens, tables,
                sm_scale=scale, tuning=tuning.mosaic_decode,
                sliding_window=kw.get("sliding_window"),
                logit_soft_cap=kw.get("logit_soft_cap")))
            stage = "public API"
            out = jax.block_until_ready(ragged_paged_attention(
                *case, sm_scale=scale, tuning=tuning, **kw))
            stage = "reference"
            ref = ragged_paged_attention_reference(*case, sm_scale=scale, **kw)
            err = rel_error(out, ref)
            num_real = int(case[5][int(case[6][0])])
            ok = (err < TOLERANCE[jnp.dtype(jnp.bfloat16)]
                  and bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
                  and not bool(jnp.any(out[num_real:])))
            rows.append(dict(name, rel_err=err, ok=ok))
        except Exception as e:
            rows.append(dict(name, ok=False, rel_err=float("nan"),
                             failed_at=stage, error=repr(e)[:600]))
            break
    print(json.dumps(rows))


def correctness():
    import subprocess
    rows = []
    for variant in CHECKED:
        for i in range(len(CONFIGS)):
            if variant != "default" and i >= 3:
                continue
            r = subprocess.run(
                [sys.executable, __file__, "--check-config", str(i),
                 "--variant", variant], capture_output=True, text=True)
            try:
                got = json.loads(r.stdout.strip().splitlines()[-1])
            except Exception:
                got = [dict(config=CONFIGS[i], mosaic=variant,
                            ok=False, rel_err=float("nan"),
                            error=(r.stdout + r.stderr)[-1500:])]
            for g in got:
                print("correctness", g.get("rel_err"), g["ok"],
                      {k: v for k, v in g.items()
                       if k not in ("rel_err", "ok")}, flush=True)
            rows += got
    return rows


def time_shape(name, s, l, bw):
    import jax

    from jaxinfer.pallas_kernels import ragged_paged_attention
    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import MosaicDecodeTuning as M
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import default_tuning
    args = batch([(1, l)] * s, jax.random.PRNGKey(0), jax.numpy.bfloat16)
    kv_bytes = 2 * s * l * K * H * 2
    res = {}

    def run(label, fn, *a):
        try:
            ts = time_fn(fn, *a)
            res[label] = dict(median_s=statistics.median(ts), repeats=ts,
                              tb_s=kv_bytes / statistics.median(ts) / 1e12,
                              frac_of_copy=kv_bytes / statistics.median(ts) / bw)
        except Exception as e:
            res[label] = dict(error=report_error(f"{name} {label}", e))
        print(name, label, {k: v for k, v in res[label].items()
                            if k != "repeats" and k != "error"}, flush=True)

    base = default_tuning(H, B)
    api = lambda **t: jax.jit(functools.partial(
        ragged_paged_attention, sm_scale=H**-0.5,
        tuning=dataclasses.replace(base, **t)))
    q, kp, vp, kv_lens, tables, cu, ns = args
    qd = q.reshape(s, K, N // K, H)
    kern = lambda mt, **kw: jax.jit(functools.partial(
        mg.decode_attention, sm_scale=H**-0.5, tuning=mt, **kw))
    # ws: a producer warpgroup issues the copies (the default), one program
    # per SM with a 5-step ring; s3_2cta: 3-step rings, two programs per SM;
    # nab: no automatic warpgroup barriers; 1wg: one warpgroup does both.
    kernels = {
        "ws": M(),
        "ws_s3_2cta": M(num_stages=3, programs_per_sm=2),
        "ws_nab": M(no_auto_barriers=True),
        "ws_s3_2cta_nab": M(num_stages=3, programs_per_sm=2,
                            no_auto_barriers=True),
        "1wg": M(producer_warpgroup=False),
    }
    for label, mt in kernels.items():
        run(f"kernel_{label}", kern(mt), qd, kp, vp, kv_lens, tables)
    run("kernel_ws_again", kern(M()), qd, kp, vp, kv_lens, tables)
    run("api_triton", api(decode_backend="triton"), *args)
    for label in ("ws", "ws_s3_2cta", "ws_nab", "ws_s3_2cta_nab"):
        run(f"api_mosaic_{label}", api(decode_backend="mosaic",
                                       mosaic_decode=kernels[label]), *args)
    run("api_mosaic_ws_again", api(decode_backend="mosaic"), *args)
    return dict(params=dict(S=s, L=l, N=N, K=K, H=H, page=B,
                            dtype="bfloat16"), kv_bytes=kv_bytes, results=res)


def probe():
    """Compile and check the Mosaic kernel on one small case first: if it
    does not lower, say why and stop before spending device time."""
    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels import ragged_paged_attention_reference
    from tests.pallas_kernels.cases import make_case, rel_error
    case = make_case([(1, 1), (1, 129), (1, 700)], num_q_heads=8,
                     num_kv_heads=2, head_dim=128, dtype=jnp.bfloat16)
    q, kp, vp, kv_lens, tables, cu, ns = case
    s = tables.shape[0]
    lens = jnp.where(jnp.arange(s) < ns[0], kv_lens, 0)
    try:
        o = mg.decode_attention(q[cu[:-1]].reshape(s, 2, 4, 128), kp, vp,
                                lens, tables, sm_scale=128 ** -0.5)
    except Exception as e:
        report_error("probe", e)
        sys.exit(1)
    ref = ragged_paged_attention_reference(*case, sm_scale=128 ** -0.5)
    print("probe rel err", rel_error(o.reshape(s, 8, 128)[:3], ref[cu[:3]]),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--check-config", type=int, default=None)
    ap.add_argument("--variant", default="default")
    a = ap.parse_args()
    if a.check_config is not None:
        check_config(a.check_config, a.variant)
        return
    import jax
    print("jax", jax.__version__, jax.devices(), flush=True)
    probe()
    roof = roofline()
    bw = roof["bw"]
    print(f"copy BW {bw / 1e12:.2f} TB/s", flush=True)
    shapes = {}
    for name, s, l in [("decode_S64_L2048", 64, 2048),
                       ("decode_S1_L32768", 1, 32768)]:
        shapes[name] = time_shape(name, s, l, bw)

    def write(checks):
        out = dict(workload="kernel-decode-mgpu", command=COMMAND,
                   commit=a.commit, device=roof["device"],
                   date=datetime.datetime.now(
                       datetime.timezone.utc).isoformat(),
                   jax=jax.__version__, bw_bytes_per_s=bw,
                   copy_repeats_s=roof["copy_s"], correctness=checks,
                   results=shapes)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "kernel-decode-mgpu-h200.json"),
                  "w") as f:
            json.dump(out, f, indent=1)
    write([])  # the timings are kept even if the checks run out of time
    checks = correctness()
    write(checks)
    bad = [c for c in checks if not c["ok"]]
    print(f"\ncorrectness: {len(checks) - len(bad)}/{len(checks)} ok; worst "
          f"rel err {max(c['rel_err'] for c in checks):.2e}")
    print(f"copy BW {bw / 1e12:.2f} TB/s ({roof['device']})")
    for name, d in shapes.items():
        for label, r in d["results"].items():
            if "median_s" in r:
                print(f"{name:18s} {label:24s} {r['median_s'] * 1e6:8.1f} us "
                      f"{r['tb_s']:5.2f} TB/s {r['frac_of_copy']:5.0%}")
            else:
                print(f"{name:18s} {label:24s} failed")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
