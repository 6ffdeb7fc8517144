"""XLA compiler options of the few-row step programs on CPU.

XLA CPU hands matrix products to YNNPACK by default. For the few-row
products of a decode batch its own dot emitter is faster, with the same
greedy tokens; for wide products of many rows YNNPACK is faster (a wide
logits product most of all). So steps with more than
PREFILL_OPTIONS_MAX_TOKENS prefill tokens and decode buckets outside
DECODE_OPTIONS_ROWS sequences keep the default, and the other programs
are compiled with YNNPACK kept for reductions alone (the CPU lm_head,
`layers.rows_times_table`, is one, and much slower without it).
Multi-step windows keep the default too.

Small prefill buckets take the options for two reasons: their products are
few-row too, and a program's first run sets up its YNNPACK products, which
delays a first token.

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
# the rows where XLA's dot emitter is the faster one.
DECODE_OPTIONS_ROWS = (4, 32)
# Prefill buckets of at most this many tokens take the options too.
PREFILL_OPTIONS_MAX_TOKENS = 32
# jaxlib (major, minor) versions known to take the option and to drop
# YNNPACK's products under it.
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
