"""Does XLA run a memory-bound kernel beside a compute-bound GEMM when each
sits on its own GPU stream (``compute_on("gpu_stream:N")``)? The question
behind overlapping page reads with matmuls inside a decode step.

One program holds ``REPS`` independent pairs: paged decode attention of a
half batch (S=128 at 1,500 tokens each, llama3-8b's heads; memory-bound) and
a GEMM of 1,024 rows by 4096 x 14336 (compute-bound). Four forms of it:

- ``attention``: the attention calls alone;
- ``gemm``: the GEMMs alone;
- ``serial``: both, no annotation (XLA's one stream);
- ``streams``: attention in ``gpu_stream:1``, GEMMs in ``gpu_stream:2``,
  each pair in one scheduling group.

``overlap`` = (serial - streams) / min(attention, gemm): 1 when the shorter
one hides entirely under the longer, 0 when the streams run one after the
other. Each form runs in a subprocess per XLA flag set (flags are read at
start-up): the defaults, ``--xla_gpu_experimental_stream_annotation=true``,
and that with command buffers off.

GPU machine, repo root:

    PYTHONPATH=$PWD python3 benchmarks/kernels/stream_overlap_probe.py --out $OUT

``--smoke`` runs tiny shapes with the interpreted kernel on CPU (the stream
form is then expected to fail or to run as the serial one). Writes
stream-overlap-probe.json to --out and prints a table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

FLAG_SETS = {
    "default": "",
    "annotation": "--xla_gpu_experimental_stream_annotation=true",
    "annotation_no_cmd_buffer": ("--xla_gpu_experimental_stream_annotation=true"
                                 " --xla_gpu_enable_command_buffer="),
}
FORMS = ("attention", "gemm", "serial", "streams")
REPS = 8


def shapes(smoke: bool) -> dict:
    if smoke:
        return dict(seqs=4, ctx=40, heads=4, kv_heads=2, head_dim=64,
                    page=16, rows=64, d_in=128, d_out=256)
    return dict(seqs=128, ctx=1500, heads=32, kv_heads=8, head_dim=128,
                page=16, rows=1024, d_in=4096, d_out=14336)


def on_stream(f, n: int):
    """``f`` placed on GPU stream ``n``. JAX 0.11 made ``compute_on`` a
    wrapper taking the compute type and the outputs' memory space (0.10's
    ``compute_on2``); 0.10's ``compute_on`` is a context manager."""
    import inspect

    from jax._src import compute_on as c
    from jax._src import core
    wrapper = c.compute_on
    if "out_memory_spaces" not in inspect.signature(wrapper).parameters:
        wrapper = getattr(c, "compute_on2", None)
    if wrapper is None:
        return c.compute_on(f"gpu_stream:{n}")(f)
    return wrapper(f, compute_type=f"gpu_stream:{n}",
                   out_memory_spaces=core.MemorySpace.Device)


def measure(smoke: bool) -> dict:
    """Every form's median seconds per program in this process."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.xla_metadata import set_xla_metadata

    from benchmarks.kernels.bench_attention import batch, time_fn
    from jaxinfer.pallas_kernels import ragged_paged_attention

    sh = shapes(smoke)
    dtype = jnp.bfloat16
    case = batch([(1, sh["ctx"])] * sh["seqs"], jax.random.PRNGKey(0), dtype,
                 num_q_heads=sh["heads"], num_kv_heads=sh["kv_heads"],
                 head_dim=sh["head_dim"], page_size=sh["page"])
    q0, rest = case[0], case[1:]
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    qs = jax.random.normal(keys[0], (REPS,) + q0.shape, dtype)
    xs = jax.random.normal(keys[1], (REPS, sh["rows"], sh["d_in"]), dtype)
    w = jax.random.normal(keys[2], (sh["d_in"], sh["d_out"]), dtype) * 0.02
    scale = sh["head_dim"] ** -0.5

    def attend(q, *rest):
        return ragged_paged_attention(q, *rest, sm_scale=scale,
                                      decode_only=True, interpret=smoke)

    def gemm(x, w):
        return x @ w

    attend_s1 = on_stream(jax.jit(attend), 1)
    gemm_s2 = on_stream(jax.jit(gemm), 2)

    def program(form):
        @jax.jit
        def run(qs, xs, w, *rest):
            outs = []
            for i in range(REPS):
                if form == "streams":
                    with set_xla_metadata(_scheduling_group_id=str(i + 1)):
                        outs.append(attend_s1(qs[i], *rest))
                        outs.append(gemm_s2(xs[i], w))
                    continue
                if form in ("attention", "serial"):
                    outs.append(attend(qs[i], *rest))
                if form in ("gemm", "serial"):
                    outs.append(gemm(xs[i], w))
            return outs
        return run

    result = {"device": jax.devices()[0].device_kind, "forms": {}}
    outputs = {}
    for form in FORMS:
        try:
            fn = program(form)
            text = fn.lower(qs, xs, w, *rest).compile().as_text() or ""
            ts = time_fn(fn, qs, xs, w, *rest, repeats=7)
            outputs[form] = fn(qs, xs, w, *rest)
            result["forms"][form] = dict(
                s=statistics.median(ts), repeats_s=ts,
                async_calls=text.count("call-start"))
        except Exception as e:  # recorded; the other forms still run
            result["forms"][form] = dict(error=repr(e)[:600])
    if "serial" in outputs and "streams" in outputs:
        # The streams only reorder work: the outputs must be the same.
        result["streams_max_abs_diff"] = max(
            float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
            for a, b in zip(outputs["serial"], outputs["streams"]))
    return result


def overlap(forms: dict) -> float | None:
    try:
        a, g = forms["attention"]["s"], forms["gemm"]["s"]
        return (forms["serial"]["s"] - forms["streams"]["s"]) / min(a, g)
    except KeyError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.smoke)), flush=True)
        return 0
    rows = {}
    for name, flags in FLAG_SETS.items():
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                                          + " " + flags).strip())
        cmd = [sys.executable, __file__, "--child", name]
        if args.smoke:
            cmd.append("--smoke")
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=900)
        found = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not found:
            rows[name] = dict(error=(p.stdout + p.stderr)[-2000:])
            continue
        r = json.loads(found[-1][len("RESULT "):])
        r["overlap"] = overlap(r["forms"])
        rows[name] = r
    out = dict(workload="stream-overlap-probe", reps=REPS,
               shapes=shapes(args.smoke), flag_sets=FLAG_SETS, rows=rows,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
               command="PYTHONPATH=$PWD python3 "
                       "benchmarks/kernels/stream_overlap_probe.py --out $OUT")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "stream-overlap-probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{'flags':26} " + " ".join(f"{f:>11}" for f in FORMS)
          + "   overlap")
    for name, r in rows.items():
        if "forms" not in r:
            print(f"{name:26} failed: {r['error'][-300:]}")
            continue
        cells = []
        for f in FORMS:
            x = r["forms"].get(f, {})
            cells.append(f"{x['s'] * 1e3:9.3f}ms" if "s" in x else
                         f"{'error':>11}")
        ov = r["overlap"]
        print(f"{name:26} " + " ".join(cells)
              + f"   {'-' if ov is None else f'{ov:.2f}'}"
              + f"   diff {r.get('streams_max_abs_diff')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
