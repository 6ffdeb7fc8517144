"""XLA compiler options of the few-row step programs on CPU.

XLA CPU hands matrix products to YNNPACK by default (jaxlib 0.10-0.11).
For the few-row products of a decode batch its own dot emitter is faster:
30 layers of the embedded model's products at 8 rows took 28 ms against
36 ms, and its batched decode (8 x 64) ran at 188 tok/s against 161, with
the same greedy tokens. For wide products of many rows YNNPACK is faster
(a [256, 576] x [576, 49152] logits product 109 ms against 242 ms, and
the layers' products break even near 64 rows), so steps with prefill rows
and decode buckets outside DECODE_OPTIONS_ROWS sequences keep the
default, and the other decode-only programs (one row per sequence,
`Buckets`) are compiled with YNNPACK kept for reductions alone (the CPU
lm_head, `layers.rows_times_table`, is one: 10x slower without it).
Multi-step windows keep the default too. docs/performance.md, section 16.

Prefill buckets of at most PREFILL_OPTIONS_MAX_TOKENS tokens take the same
options: their products are few-row too (16 rows: 33 against 49 ms), and
a program's first run builds its YNNPACK products' runtime, which made the
first run of the README command's 16-token prefill 0.37-0.51 s against
0.15 s with the options (its later runs 0.08-0.10 s either way);
docs/performance.md, section 20. Their logits rows (at most 32) take the
reduction form, which keeps YNNPACK.

Passed per program (``jax.jit(..., compiler_options=...)``), not through
``XLA_FLAGS``: nothing else in the process changes, and an XLA that does
not know the option refuses it with an error rather than aborting. It is
set only for the jaxlib versions known to take it; set
``JAXINFER_CPU_DECODE_DOTS=ynnpack`` to keep YNNPACK's products.
"""

from __future__ import annotations

import os
from importlib import metadata

# YNNPACK fusions limited to reductions: products go to XLA's dot emitter.
CPU_DECODE_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
# Decode buckets of this many sequences take the options (first, last):
# measured faster at 4-16 rows (layers' products 28-33 ms against 33-49),
# the same at one row, slower at two (30 against 23) and from 64.
DECODE_OPTIONS_ROWS = (4, 32)
# Prefill buckets of at most this many tokens take the options too.
PREFILL_OPTIONS_MAX_TOKENS = 32
# jaxlib (major, minor) versions known to take the option: 0.10 timed here,
# 0.11 (the GPU machine's) checked to accept it and drop YNNPACK's products.
MEASURED_JAXLIB = ((0, 10), (0, 11))
ENV = "JAXINFER_CPU_DECODE_DOTS"  # "xla" (default) or "ynnpack"


def _jaxlib_version() -> tuple[int, int] | None:
    try:
        major, minor = metadata.version("jaxlib").split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def decode_compile_options(on_cpu: bool, environ=None,
                           jaxlib_version=None) -> dict[str, str] | None:
    """The compiler options of decode-only step programs: CPU_DECODE_OPTIONS
    on CPU with a measured jaxlib, unless ``JAXINFER_CPU_DECODE_DOTS`` says
    "ynnpack"; None otherwise (the default compile)."""
    environ = os.environ if environ is None else environ
    choice = environ.get(ENV, "xla")
    if choice not in ("xla", "ynnpack"):
        raise ValueError(f"{ENV}={choice!r}: expected 'xla' (XLA's dot "
                         "emitter for CPU decode steps) or 'ynnpack'")
    if not on_cpu or choice == "ynnpack":
        return None
    version = _jaxlib_version() if jaxlib_version is None else jaxlib_version
    return dict(CPU_DECODE_OPTIONS) if version in MEASURED_JAXLIB else None
