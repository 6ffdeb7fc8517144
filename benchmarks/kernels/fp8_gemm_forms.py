"""How an fp8 product is written decides what XLA GPU makes of it.

Times one llama3-8b MLP pair (gate 4096 -> 14336, down 14336 -> 4096) at
256 and 16384 rows in several written forms of the same W8A8 product, and
records which kernels XLA compiled each form to (the custom-call targets
and fusion kinds of the optimized HLO), beside bf16:

- ``bf16``: x @ w.T in bf16.
- ``scheme-tensor`` / ``scheme-channel-token``: ``Fp8Weights.apply`` as
  the engine runs it (dot of e4m3 codes into f32, scales after).
- ``f8dot-bf16out-*``: the same dot with a bf16 result, scales after (half
  the result bytes).
- ``dequant-pattern-tensor``: dot(convert(xq) * xs, convert(w) * ws) in
  bf16, the form XLA's GEMM rewriter documents for scaled fp8 matmuls.

    python3 benchmarks/kernels/fp8_gemm_forms.py --out OUT [--smoke]

Writes OUT/fp8-gemm-forms-<device>.json and prints a table last. ``--smoke``
runs tiny shapes on CPU (checks the script; XLA CPU has no fp8 GEMM).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if "--smoke" in sys.argv:
    os.environ["BENCH_SMOKE"] = "1"  # roofline's CPU stand-in

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.kernels.bench_attention import roofline, time_fn
from benchmarks.run_stamp import run_stamp
from benchmarks.step_breakdown import profile_steps
from jaxinfer.models.quantization import methods as qm
from jaxinfer.models.quantization.hf_checkpoints import quantize_linear


class _Layer:
    """What a LinearMethod and the at-load quantizer read of a Linear."""
    def __init__(self, n_in, n_out):
        self.in_shape, self.out_shape = (n_in,), (n_out,)
        self.axes = ("embed", "mlp")


def _scheme(name) -> qm.Fp8Weights:
    per_channel = "channel" in name
    return qm.Fp8Weights(per_channel=per_channel,
                         activation="per_token" if per_channel else
                         "per_tensor")


def params(name, w):
    """The weight w [out, in] as form ``name`` holds it: bf16, or quantized
    by the engine's own at-load quantizer."""
    if name == "bf16":
        return {"w": w.astype(jnp.bfloat16)}
    n_out, n_in = w.shape
    return quantize_linear(_scheme(name), {"weight": np.asarray(w)}.get, "",
                           _Layer(n_in, n_out), "fp8_gemm_forms")


def form(name):
    """name -> fn(x bf16 [M, In], p) -> bf16 [M, Out]. The scheme forms are
    ``Fp8Weights.apply`` itself, with the dot's result in float32
    ("scheme-*") or in the activations' dtype ("f8dot-bf16out-*",
    ``methods.FP8_PRODUCT_DTYPE``; the switch acts while tracing)."""
    if name == "bf16":
        return lambda x, p: x @ p["w"].T
    scheme = _scheme(name)

    def apply(x, p, product):
        old = qm.FP8_PRODUCT_DTYPE
        qm.FP8_PRODUCT_DTYPE = product
        try:
            return scheme.apply(_Layer(x.shape[-1], p["weight"].shape[0]), p,
                                x)
        finally:
            qm.FP8_PRODUCT_DTYPE = old

    def dequant_pattern(x, p):
        xq, xs = qm.quantize_activations(x.astype(jnp.float32),
                                         scheme.activation)
        a = xq.astype(jnp.bfloat16) * xs.astype(jnp.bfloat16)
        b = (p["weight"].astype(jnp.bfloat16)
             * jnp.asarray(p["weight_scale"], jnp.bfloat16))
        return qm._dot_minor(a, b, 1)

    if name.startswith("scheme"):
        return lambda x, p: apply(x, p, "float32")
    if name.startswith("f8dot-bf16out"):
        return lambda x, p: apply(x, p, "activations")
    if name.startswith("dequant-pattern"):
        return dequant_pattern
    raise ValueError(name)


FORMS = ("bf16", "scheme-tensor", "scheme-channel-token",
         "f8dot-bf16out-tensor", "f8dot-bf16out-channel-token",
         "dequant-pattern-tensor")


def kernels_of(compiled_text: str) -> dict:
    """Counts of custom-call targets and fusion kinds in optimized HLO."""
    out = {}
    for m in re.finditer(r'custom_call_target="([^"]+)"', compiled_text):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    for m in re.finditer(r'kind=(k\w+)', compiled_text):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    D, F = (64, 128) if args.smoke else (4096, 14336)
    Ms = (8, 32) if args.smoke else (256, 16384)
    roof = roofline()
    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    w_up = jax.random.normal(k1, (F, D), jnp.float32) * 0.02
    w_down = jax.random.normal(k2, (D, F), jnp.float32) * 0.02
    rows = []
    for M in Ms:
        x = (jax.random.normal(k3, (M, D), jnp.float32)).astype(jnp.bfloat16)
        ref = None
        for name in FORMS:
            # On the device once: the at-load quantizer returns host arrays,
            # which each call would otherwise copy over (the first version
            # of this script timed those copies).
            ps = [jax.device_put(params(name, w)) for w in (w_up, w_down)]
            f = form(name)

            @jax.jit
            def pair(x, p_up, p_down, f=f):
                h = f(x, p_up)
                return f(jax.nn.silu(h), p_down)
            row = dict(M=M, form=name)
            try:
                compiled = pair.lower(x, *ps).compile()
                text = compiled.as_text()
                row["kernels"] = kernels_of(text)
                row["gemm_lines"] = [ln.strip()[:400] for ln in text.splitlines()
                                     if "custom_call_target" in ln
                                     or "__triton" in ln][:8]
                y = np.asarray(pair(x, *ps), np.float32)
                if name == "bf16":
                    ref = y
                row["rel_err_vs_bf16"] = float(
                    np.linalg.norm(y - ref) / np.linalg.norm(ref))
                if not args.smoke:
                    ts = time_fn(pair, x, *ps, repeats=7)
                    row["repeats_s"] = ts
                    row["us"] = statistics.median(ts) * 1e6
                    row["tflops"] = 2 * M * D * F * 2 / statistics.median(ts) / 1e12
                    # The GEMMs' own time against the work around them.
                    row["profile"] = profile_steps(lambda: pair(x, *ps), 3)
            except Exception as e:  # record it, time the others
                row["error"] = repr(e)[:600]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items()
                              if k not in ("repeats_s", "gemm_lines",
                                           "profile")}),
                  flush=True)
    for M in Ms:
        base = next((r.get("us") for r in rows
                     if r["M"] == M and r["form"] == "bf16"), None)
        for r in rows:
            if r["M"] == M and base and r.get("us"):
                r["speedup_vs_bf16"] = base / r["us"]
    result = dict(workload="fp8-gemm-forms", **run_stamp(), device=roof["device"],
                  bw_bytes_per_s=roof["bw"], matmul_flops_per_s=roof["flops"],
                  xla_flags=os.environ.get("XLA_FLAGS", ""),
                  command="python3 benchmarks/kernels/fp8_gemm_forms.py "
                  + " ".join(sys.argv[1:]), rows=rows)
    os.makedirs(args.out, exist_ok=True)
    dev = roof["device"].lower().replace(" ", "-")
    with open(os.path.join(args.out, f"fp8-gemm-forms-{dev}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'M':>6} {'form':30} {'us':>9} {'x bf16':>7} {'TF/s':>6} "
          f"{'gemm us':>8} {'rest us':>8}  kernels")
    for r in rows:
        groups = r.get("profile", {}).get("groups", {})
        gemm = groups.get("matmul", {}).get("ms", float("nan")) * 1e3
        rest = sum(g["ms"] for k, g in groups.items() if k != "matmul") * 1e3
        print(f"{r['M']:>6} {r['form']:30} {r.get('us', float('nan')):9.1f} "
              f"{r.get('speedup_vs_bf16', float('nan')):7.2f} "
              f"{r.get('tflops', float('nan')):6.0f} {gemm:8.1f} {rest:8.1f}  "
              f"{r.get('kernels', r.get('error', ''))}")


if __name__ == "__main__":
    main()
