"""Probe of the Mosaic GPU decode kernel's fault at page size 32 (NOTES.md
v4): each variant runs in its own process (a fault poisons the CUDA
context), then one variant under compute-sanitizer when it is there.

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/page32_probe.py --out $OUT

Prints one line per variant (ok + rel err, or the exit code and the last
error line); writes page32-probe.json.

On CPU one variant runs in jax's interpreter with its race detection and
out-of-bounds reads raising (p32_v4, v4's faulting settings, gave no race
and rel err 2.3e-3: NOTES.md v17):

    PAGE32_CHECKS=1 PYTHONPATH=$PWD python benchmarks/kernels/page32_probe.py --child p32_v4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

VARIANTS = {
    "p16": dict(page=16),
    "p32": dict(page=32),
    "p32_1wg": dict(page=32, producer=False),
    "p32_t128_1wg": dict(page=32, producer=False, tokens=128, stages=2),
    "p32_h64_1wg": dict(page=32, producer=False, head_dim=64),
    # v4's faulting settings: the automatic ring depth (5 stages at H=128),
    # automatic splits, long sequences.
    "p32_v4": dict(page=32, stages=0, splits=0, lens=(5000, 2048, 33)),
}


def child(name: str) -> None:
    import jax.numpy as jnp

    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels import ragged_paged_attention_reference
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import MosaicDecodeTuning
    from tests.pallas_kernels.cases import make_case, rel_error
    cfg = VARIANTS[name]
    mg._PAGE_SIZES = (16, 32)  # let page 32 through for the probe
    head_dim = cfg.get("head_dim", 128)
    if os.environ.get("PAGE32_CHECKS"):
        # Interpreted runs only: jax's interpreter checks the kernel's
        # smem accesses for races and raises on out-of-bounds reads.
        from jaxinfer.pallas_kernels import kernel_common
        mg.mosaic_interpret_params = lambda **kw: (
            kernel_common.mosaic_interpret_params(
                detect_races=True, out_of_bounds_reads="raise", **kw))
    lens = cfg.get("lens", (300, 70, 33))
    case = make_case([(1, n) for n in lens], num_q_heads=8,
                     num_kv_heads=2, head_dim=head_dim,
                     page_size=cfg["page"], dtype=jnp.bfloat16, pad_tokens=0)
    q, kp, vp, kv_lens, tables, cu, num_seqs = case
    S = tables.shape[0]
    rows = jnp.minimum(cu[:-1], q.shape[0] - 1)
    q_dec = q[rows].reshape(S, 2, 4, head_dim)
    real = jnp.arange(S) < num_seqs[0]
    tuning = MosaicDecodeTuning(
        tokens_per_step=cfg.get("tokens", 64), num_stages=cfg.get("stages", 2),
        kv_splits=cfg.get("splits", 2),
        producer_warpgroup=cfg.get("producer", True))
    import jax
    out = mg.decode_attention(q_dec, kp, vp, jnp.where(real, kv_lens, 0),
                              tables, sm_scale=head_dim ** -0.5, tuning=tuning,
                              interpret=jax.default_backend() != "gpu")
    out = out.block_until_ready()
    ref = ragged_paged_attention_reference(*case, sm_scale=head_dim ** -0.5)
    err = rel_error(out.reshape(S, 8, head_dim)[:3], ref[rows][:3])
    extra = {}
    if os.environ.get("PAGE32_CHECKS"):
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc
        extra["races_found"] = bool(ipc.get_races().races_found)
    print(json.dumps(dict(variant=name, rel_err=err, **extra)))


def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout)
        lines = (p.stdout + p.stderr).strip().splitlines()
        return dict(rc=p.returncode, tail=lines[-12:])
    except subprocess.TimeoutExpired:
        return dict(rc="timeout", tail=[])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--child")
    ap.add_argument("--sanitize", default="p32_1wg")
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    res = {n: run(me + [n], 60) for n in VARIANTS}
    san = shutil.which("compute-sanitizer")
    if san and a.sanitize:
        res["sanitizer_" + a.sanitize] = run(
            [san, "--tool", "memcheck", "--print-limit", "5"] + me
            + [a.sanitize], 120)
    with open(os.path.join(a.out, "page32-probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    for n, r in res.items():
        last = [x for x in r["tail"] if x.strip()][-1:] or [""]
        print(f"{n:28s} rc={r['rc']}  {last[0][:300]}")
    for n, r in res.items():
        if n.startswith("sanitizer"):
            print("\n".join(r["tail"]))


if __name__ == "__main__":
    main()
