"""Mosaic GPU paged prefill kernel: correctness, then timing against the bf16
matmul rate, cuDNN and the Triton prefill in the same run.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/bench_prefill_mgpu.py --out $OUT

Each phase runs in its own process under a time limit, so that a kernel
that faults or deadlocks costs its phase only:

1. ``probe``: compile on a small ragged case and compare with the reference;
2. ``time``: torch bf16 matmul rate (8192^3), then medians of repeats on
   8 x 2048 causal (N=32 K=8 H=128 page 16 bf16): the kernel (through
   ``prefill_attention``: work items + kernel + one small scatter) in a few block
   configs, the public ``ragged_paged_attention`` (Triton prefill), cuDNN
   and JAX's bundled ``attention_mgpu`` (f16, contiguous K/V);
3. ``correct``: ragged mixes (q_len, kv_len) with decodes among them, pages
   16/32, GQA 1/4/8, H 64/128, window, soft-cap, k/v scales, f16.

``--phases api`` instead: the public ``ragged_paged_attention`` (automatic
backends) against the reference on two mixed batches and its time on the
8 x 2048 shape next to ``prefill_backend="triton"``.

Prints a table last; writes kernel-prefill-mgpu-h200.json (or, for
``--phases api``, kernel-prefill-mgpu-api-h200.json) to --out.
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

SEQS, L, N, K, H, B = 8, 2048, 32, 8, 128, 16
COMMAND = ("export PYTHONPATH=$PWD; "
           "python3 benchmarks/kernels/bench_prefill_mgpu.py --out $OUT")
CONFIGS = {  # name: MosaicPrefillTuning fields
    "t128_s2": dict(tokens_per_step=128, num_stages=2),
    "t64_s4": dict(tokens_per_step=64, num_stages=4),
    "t128_s2_nosched": dict(tokens_per_step=128, num_stages=2,
                            schedule_barrier=False),
    "t128_s3": dict(tokens_per_step=128, num_stages=3),
}


def _err(e):
    return "".join(traceback.format_exception(e))[-2500:]


def _prefill_rows(cu, mix):
    import numpy as np
    return np.concatenate([np.arange(int(cu[s]), int(cu[s + 1]))
                           for s, (ql, _) in enumerate(mix) if ql > 1])


def check(mix, *, group, head_dim, page, dtype, seed, tuning=None, **kw):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxinfer.pallas_kernels import ragged_paged_attention_prefill_mgpu as pm
    from jaxinfer.pallas_kernels import ragged_paged_attention_reference
    from tests.pallas_kernels.cases import TOLERANCE, make_case, rel_error
    case = make_case(mix, num_q_heads=2 * group, num_kv_heads=2,
                     head_dim=head_dim, page_size=page, dtype=dtype, seed=seed)
    scale = head_dim ** -0.5
    dec = jax.random.normal(jax.random.PRNGKey(seed),
                            (case[4].shape[0], *case[0].shape[1:]), dtype)
    fn = jax.jit(functools.partial(
        pm.prefill_attention, sm_scale=scale,
        tuning=pm.MosaicPrefillTuning(**(tuning or {})), **kw))
    out = fn(*case, dec)
    ref = ragged_paged_attention_reference(*case, sm_scale=scale, **kw)
    rows = _prefill_rows(case[5], mix)
    err = rel_error(out[rows], ref[rows])
    cu = np.asarray(case[5])
    dec_seqs = np.asarray([s for s, (q, _) in enumerate(mix) if q == 1], int)
    kept = bool(jnp.all(out[cu[dec_seqs]] == dec[dec_seqs])) and not bool(
        jnp.any(out[cu[len(mix)]:]))  # decode rows placed, padding zeros
    tol = TOLERANCE.get(jnp.dtype(dtype), 2e-2)
    return dict(rel_err=err, kept_other_rows=kept,
                finite=bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))),
                ok=bool(err < tol and kept))


def _checked(phase, label, mix, **kw):
    """check(), its error recorded instead of raised; prints one line."""
    try:
        r = check(mix, **kw)
    except Exception as e:
        r = dict(ok=False, error=_err(e))
        print(label, r["error"], flush=True)
    print(phase, label, {k: v for k, v in r.items() if k != "error"},
          flush=True)
    return r


def phase_probe():
    import jax.numpy as jnp
    rows = []
    for name, mix in [
            ("small", [(5, 18), (130, 200), (1, 7), (64, 64)]),
            ("long", [(300, 1000), (128, 128)]),
            ("ragged", [(300, 1000), (1, 9), (70, 70), (13, 13)])]:
        r = _checked("probe", name, mix, group=4, head_dim=128, page=16,
                     dtype=jnp.bfloat16, seed=1)
        rows.append(dict(name=name, **r))
    return rows


def phase_correct():
    import jax.numpy as jnp
    mix = [(2048, 2048), (512, 2048), (1, 129), (120, 597), (5, 18),
           (200, 200)]
    rows = []
    cases = [
        dict(group=4, head_dim=128, page=16),
        dict(group=1, head_dim=128, page=32),
        dict(group=8, head_dim=64, page=16),
        dict(group=4, head_dim=128, page=16, sliding_window=300,
             logit_soft_cap=30.0),
        dict(group=4, head_dim=64, page=32, k_scale=0.5, v_scale=1.5),
        dict(group=4, head_dim=128, page=16, dtype=jnp.float16),
        dict(group=4, head_dim=128, page=16, tuning=dict(tokens_per_step=64,
                                                         num_stages=4)),
        dict(group=4, head_dim=128, page=32, sliding_window=100),
    ]
    for i, c in enumerate(cases):
        c = dict(c)
        c.setdefault("dtype", jnp.bfloat16)
        name = {k: (v if not hasattr(v, "dtype") else str(v))
                for k, v in c.items()}
        name["dtype"] = jnp.dtype(c["dtype"]).name
        r = _checked("correct", name, mix, seed=i, **c)
        rows.append(dict(case=name, **r))
    return rows


def phase_time():
    import jax
    import jax.numpy as jnp

    from benchmarks.kernels.bench_attention import batch, roofline, time_fn
    from jaxinfer.pallas_kernels import ragged_paged_attention
    from jaxinfer.pallas_kernels import ragged_paged_attention_prefill_mgpu as pm
    roof = roofline()
    flops = 4 * SEQS * (L * (L + 1) // 2) * N * H
    rows = {}

    def run(name, fn, *args):
        try:
            ts = time_fn(fn, *args)
            med = statistics.median(ts)
            rows[name] = dict(median_s=med, repeats=ts,
                              tflops=flops / med / 1e12,
                              frac_of_matmul=flops / med / roof["flops"])
        except Exception as e:
            rows[name] = dict(error=_err(e))
            print(name, rows[name]["error"], flush=True)
        print("time", name, {k: v for k, v in rows[name].items()
                             if k not in ("repeats", "error")}, flush=True)

    args = batch([(L, L)] * SEQS, jax.random.PRNGKey(0), jnp.bfloat16)
    for name, cfg in CONFIGS.items():
        fn = jax.jit(functools.partial(
            pm.prefill_attention, sm_scale=H**-0.5,
            tuning=pm.MosaicPrefillTuning(**cfg)))
        run(f"mosaic_{name}", fn, *args)
    run("triton_api", jax.jit(functools.partial(ragged_paged_attention,
                                                sm_scale=H**-0.5)), *args)
    q = args[0]
    qb = q.reshape(SEQS, L, N, H)
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    kb = jax.random.normal(k1, (SEQS, L, K, H), jnp.bfloat16)
    vb = jax.random.normal(k2, (SEQS, L, K, H), jnp.bfloat16)
    run("cudnn", jax.jit(functools.partial(
        jax.nn.dot_product_attention, is_causal=True, scale=H**-0.5,
        implementation="cudnn")), qb, kb, vb)
    try:
        from jax.experimental.pallas.ops.gpu import attention_mgpu
        cfg = attention_mgpu.TuningConfig(block_q=64, block_kv=128,
                                          max_concurrent_steps=2, causal=True)
        run("bundled_attention_mgpu_f16",
            jax.jit(functools.partial(attention_mgpu.attention, config=cfg)),
            *[x.astype(jnp.float16) for x in (qb, kb, vb)])
    except Exception as e:
        rows["bundled_attention_mgpu_f16"] = dict(error=_err(e))
    return dict(flops=flops, matmul_flops_per_s=roof["flops"],
                matmul_s=roof["matmul_s"], copy_bw=roof["bw"],
                device=roof["device"], rows=rows)


def phase_api():
    """The public ragged_paged_attention with the automatic backends (Mosaic
    prefill and decode on Hopper) against the reference, and its time on
    8 x 2048 next to the forced Triton prefill."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from benchmarks.kernels.bench_attention import batch, roofline, time_fn
    from jaxinfer.pallas_kernels import ragged_paged_attention, ragged_paged_attention_reference
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import default_tuning
    from tests.pallas_kernels.cases import make_case, rel_error
    res = dict(correct=[], time={})
    mix = [(2048, 2048), (512, 2048), (1, 129), (120, 597), (5, 18),
           (1, 3000)]
    for group, hd, page, kw in [(4, 128, 16, {}), (8, 64, 16, dict(
            sliding_window=300, logit_soft_cap=30.0, k_scale=0.5,
            v_scale=1.5))]:
        case = make_case(mix, num_q_heads=2 * group, num_kv_heads=2,
                         head_dim=hd, page_size=page, dtype=jnp.bfloat16,
                         seed=hd)
        try:
            out = jax.jit(functools.partial(
                ragged_paged_attention, sm_scale=hd**-0.5, **kw))(*case)
            ref = ragged_paged_attention_reference(*case, sm_scale=hd**-0.5,
                                                   **kw)
            err = rel_error(out, ref)
            r = dict(group=group, head_dim=hd, rel_err=err, ok=err < 2e-2)
        except Exception as e:
            r = dict(group=group, head_dim=hd, ok=False, error=_err(e))
        res["correct"].append(r)
        print("api correct", {k: v for k, v in r.items() if k != "error"},
              flush=True)
    roof = roofline()
    flops = 4 * SEQS * (L * (L + 1) // 2) * N * H
    args = batch([(L, L)] * SEQS, jax.random.PRNGKey(0), jnp.bfloat16)
    base = default_tuning(H, B)
    for name, t in [("api_auto", base), ("api_triton_prefill",
                    dataclasses.replace(base, prefill_backend="triton"))]:
        try:
            ts = time_fn(jax.jit(functools.partial(
                ragged_paged_attention, sm_scale=H**-0.5, tuning=t)), *args)
            med = statistics.median(ts)
            res["time"][name] = dict(median_s=med, repeats=ts,
                                     tflops=flops / med / 1e12,
                                     frac_of_matmul=flops / med / roof["flops"])
        except Exception as e:
            res["time"][name] = dict(error=_err(e))
        print("api time", name, {k: v for k, v in res["time"][name].items()
                                 if k not in ("repeats", "error")}, flush=True)
    res["matmul_flops_per_s"] = roof["flops"]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--phase", default="")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--limits", default="150,200,200,150")
    ap.add_argument("--phases", default="probe,time,correct")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.phase:
        import jax
        print("jax", jax.__version__, jax.devices(), flush=True)
        res = dict(probe=phase_probe, time=phase_time, correct=phase_correct,
                   api=phase_api)[a.phase]()
        with open(os.path.join(a.out, f"part_{a.phase}.json"), "w") as f:
            json.dump(res, f, indent=1)
        return
    record = dict(workload="kernel-prefill-mgpu", command=COMMAND,
                  commit=a.commit, shape=dict(seqs=SEQS, L=L, N=N, K=K, H=H,
                                              page=B, dtype="bfloat16",
                                              causal=True),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat())
    limits = dict(zip(("probe", "time", "correct", "api"),
                      map(int, a.limits.split(","))))
    for phase in a.phases.split(","):
        if phase not in ("probe", "api") and not any(
                r.get("ok") for r in record.get("probe", [])):
            print(f"skipping {phase}: probe failed", flush=True)
            break
        try:
            subprocess.run([sys.executable, __file__, "--phase", phase,
                            "--out", a.out], timeout=limits[phase],
                           check=False)
        except subprocess.TimeoutExpired:
            print(f"{phase} timed out after {limits[phase]} s", flush=True)
        part = os.path.join(a.out, f"part_{phase}.json")
        if os.path.exists(part):
            with open(part) as f:
                record[phase] = json.load(f)
            os.remove(part)
        else:
            record[phase] = {"error": "no result (crash or time-out)"}
    if "api" in record:
        print("api:", json.dumps({k: v for k, v in record["api"].items()
                                  if k != "time"})[:600])
        for name, r in record["api"].get("time", {}).items():
            print(f"  {name:34s} {r.get('median_s', float('nan')) * 1e3:7.3f}"
                  f" ms {r.get('frac_of_matmul', float('nan')):6.1%}")
    name = ("kernel-prefill-mgpu-h200.json" if a.phases != "api"
            else "kernel-prefill-mgpu-api-h200.json")
    with open(os.path.join(a.out, name), "w") as f:
        json.dump(record, f, indent=1)
    print("\nprobe:", [(r["name"], r.get("ok"), r.get("rel_err"))
                       for r in record.get("probe", []) if isinstance(r, dict)])
    corr = record.get("correct")
    if isinstance(corr, list):
        print(f"correct: {sum(r['ok'] for r in corr)}/{len(corr)} ok, worst "
              f"{max(r.get('rel_err', float('nan')) for r in corr):.2e}")
    t = record.get("time")
    if isinstance(t, dict) and "rows" in t:
        print(f"matmul {t['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s; "
              f"8x2048 causal prefill ({t['device']}):")
        for name, r in t["rows"].items():
            if "median_s" in r:
                print(f"  {name:34s} {r['median_s'] * 1e3:7.3f} ms "
                      f"{r['tflops']:6.0f} TFLOP/s "
                      f"{100 * r['frac_of_matmul']:5.1f}%")
            else:
                print(f"  {name:34s} failed")


if __name__ == "__main__":
    main()
