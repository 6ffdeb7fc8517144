"""SASS of the Mosaic int4 kernel's consumer loop, per form, on the GPU:
how many instructions a 64 x 128 group tile costs each thread, by kind.

    python3 benchmarks/kernels/int4_sass.py --out DIR [--forms weights,fma]

Compiles gate/up (4096 -> 14336) at one row under MOSAIC_GPU_DUMP_SASS /
MOSAIC_GPU_DUMP_PTXAS (Mosaic writes the dumps into a folder per form),
finds the kernel's loop (the longest backward branch's body), and counts
its instructions by opcode; where Mosaic cannot write SASS (it runs an
``nvdisasm`` the GPU machine's PATH lacks) it counts the PTX loop instead. Writes int4-sass.json with the counts and keeps
the dumps beside it. The prediction this checks sits in
pallas_kernels/NOTES.md (int4 v6).
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


LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
BRA = re.compile(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def loop_counts(sass: str) -> dict:
    """Opcode counts of the longest loop body (a backward branch's range)."""
    instrs = []  # (address, opcode, text)
    for line in sass.splitlines():
        m = LINE.search(line)
        if m:
            instrs.append((int(m.group(1), 16), m.group(3), line.strip()))
    labels = {}
    for line in sass.splitlines():
        m = re.match(r"\s*\.L_x_(\d+):", line)
        if m:
            labels[m.group(1)] = None
    best = None
    for i, (addr, op, text) in enumerate(instrs):
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", text.split("BRA", 1)[1])
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < addr:
            body = [o for a, o, _ in instrs if target <= a <= addr]
            if best is None or len(body) > len(best):
                best = body
    return dict(collections.Counter(best or []).most_common())


PTX_LABEL = re.compile(r"^\s*(\$L__\w+):")
PTX_BRA = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")


def ptx_loop_counts(ptx: str) -> dict:
    """Opcode counts of the longest PTX loop body (a branch back to an
    earlier label): the fallback where Mosaic's SASS dump needs an
    ``nvdisasm`` the machine's PATH lacks."""
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
        sass_files = [f for f in files if f.endswith(".sass")] or files
        counts, source = {}, "sass"
        for f in sass_files:
            text = open(f, errors="replace").read()
            c = loop_counts(text)
            if sum(c.values()) > sum(counts.values()):
                counts = c
        if not counts:  # no SASS came out: count the PTX instead
            source = "ptx"
            for f in (f for f in files if f.endswith(".ptx")):
                c = ptx_loop_counts(open(f, errors="replace").read())
                if sum(c.values()) > sum(counts.values()):
                    counts = c
        ptxas = [open(f, errors="replace").read()[-2000:] for f in files
                 if "ptxas" in os.path.basename(f)]
        result[form] = {"files": [os.path.basename(f) for f in files],
                        "counted_from": source,
                        "loop_instructions": sum(counts.values()),
                        "loop_opcodes": counts, "ptxas": ptxas}
        print(form, source, sum(counts.values()), list(counts.items())[:25],
              flush=True)
    with open(os.path.join(args.out, "int4-sass.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
