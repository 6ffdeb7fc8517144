"""The Mosaic int4 kernel's consumer loop, per form, on the GPU: how many
instructions a 64 x 128 group tile costs each thread, by kind.

    python3 benchmarks/kernels/int4_loop_counts.py --out DIR [--forms weights,fma]

Compiles gate/up (4096 -> 14336) at one row in a fresh process under
Mosaic's dump switches (PTX, ptxas's report, SASS where Mosaic can run
``nvdisasm``: the H200 machine's PATH lacks it), finds the PTX's loop (the
longest branch back to an earlier label) and counts its instructions by
opcode. Writes int4-loop-counts.json with the counts and keeps the dumps
beside it. pallas_kernels/NOTES.md (int4 v6) has the counts of one run.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys


def compile_form(form: str, dump: str) -> None:
    """Compiles and runs the kernel once in a fresh process with the dump
    switches set (Mosaic reads them at compile time)."""
    os.makedirs(dump, exist_ok=True)
    env = dict(os.environ, MOSAIC_GPU_DUMP_SASS="1", MOSAIC_GPU_DUMP_PTXAS="1",
               MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_TO=dump)
    code = f"""
import jax, jax.numpy as jnp
from jaxinfer.pallas_kernels.int4_matmul_mgpu import (Int4MosaicTuning,
    int4_matmul_mgpu)
k = jax.random.split(jax.random.key(0), 4)
x = jax.random.normal(k[0], (1, 4096), jnp.bfloat16)
q = jax.random.bits(k[1], (14336, 2048), jnp.uint8)
s = jax.random.uniform(k[2], (14336, 32), jnp.float16) * 0.01
z = jax.random.bits(k[3], (14336, 32), jnp.uint8) & 0xF
f = jax.jit(lambda *a: int4_matmul_mgpu(
    *a, tuning=Int4MosaicTuning(scale_on={form!r})))
f(x, q, s, z).block_until_ready()
"""
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


PTX_LABEL = re.compile(r"^\s*(\$L__\w+):")
PTX_BRA = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")


def ptx_loop_counts(ptx: str) -> dict:
    """Opcode counts of the longest PTX loop body (a branch back to an
    earlier label)."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, l in enumerate(lines)
              if (m := PTX_LABEL.match(l))}
    best: list[str] = []
    for i, line in enumerate(lines):
        m = PTX_BRA.search(line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i + 1]
            if len(body) > len(best):
                best = body
    ops = []
    for line in best:
        t = line.strip()
        if not t or t.startswith(("//", "$", "{", "}", ".reg", ".loc")):
            continue
        t = re.sub(r"^@!?%p\d+\s+", "", t)
        ops.append(t.split()[0].rstrip(";"))
    return dict(collections.Counter(ops).most_common())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--forms", default="weights,fma,partials")
    args = ap.parse_args()
    result = {}
    for form in args.forms.split(","):
        dump = os.path.join(args.out, f"dump-{form}")
        compile_form(form, dump)
        files = sorted(glob.glob(os.path.join(dump, "*")))
        counts = {}
        for f in (f for f in files if f.endswith(".ptx")):
            c = ptx_loop_counts(open(f, errors="replace").read())
            if sum(c.values()) > sum(counts.values()):
                counts = c
        ptxas = [open(f, errors="replace").read()[-2000:] for f in files
                 if "ptxas" in os.path.basename(f)]
        result[form] = {"files": [os.path.basename(f) for f in files],
                        "counted_from": "ptx",
                        "loop_instructions": sum(counts.values()),
                        "loop_opcodes": counts, "ptxas": ptxas}
        print(form, sum(counts.values()), list(counts.items())[:25],
              flush=True)
    with open(os.path.join(args.out, "int4-loop-counts.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
