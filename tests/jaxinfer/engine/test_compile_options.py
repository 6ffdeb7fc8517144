"""Decode-only step programs on CPU compile with their own XLA options
(jaxinfer/worker/compile_options.py)."""

from __future__ import annotations

import pytest

from jaxinfer.worker import compile_options
from jaxinfer.worker.compile_options import (CPU_DECODE_OPTIONS,
                                             decode_compile_options)


def test_options_follow_platform_choice_and_jaxlib():
    measured = compile_options.MEASURED_JAXLIB[0]
    assert decode_compile_options(True, {}, measured) == CPU_DECODE_OPTIONS
    assert decode_compile_options(False, {}, measured) is None
    env = {compile_options.ENV: "ynnpack"}
    assert decode_compile_options(True, env, measured) is None
    assert decode_compile_options(True, {}, (0, 99)) is None
    with pytest.raises(ValueError, match="JAXINFER_CPU_DECODE_DOTS"):
        decode_compile_options(True, {compile_options.ENV: "mkl"}, measured)


def _ynn_products(compiled_text: str) -> int:
    return sum(1 for line in compiled_text.splitlines()
               if "__ynn_fusion" in line and "dot_general" in line)


def test_decode_buckets_compile_products_outside_ynnpack(make_llm):
    """Warm-up's program for each decode-only bucket is the runner's
    decode forward, and its products compile to XLA's own dots; buckets
    with prefill rows keep YNNPACK's (the default compile)."""
    from jaxinfer.worker.warmup import wanted_programs
    runner = make_llm().llm_engine.runner
    if runner.decode_options is None:
        pytest.skip("no decode options on this platform or jaxlib")
    forwards = {key[1]: todo for key, todo in wanted_programs(runner).items()
                if key[0] == "forward"}
    decode = [dims for dims in forwards if dims[3] and dims[1] >= 4]
    prefill = [dims for dims in forwards if not dims[3]]
    assert decode and prefill
    lo, hi = compile_options.DECODE_OPTIONS_ROWS
    for dims, (jitted, _, _) in forwards.items():
        assert jitted is runner.forward_program(dims)
        assert (jitted is runner._forward_decode) == (
            dims[3] and lo <= dims[1] <= hi)
    # Decode buckets outside the measured rows keep the default compile.
    for rows in (lo - 1, hi * 2):
        assert runner.forward_program((rows, rows, 4, True)) is runner._forward
    texts = {}
    for dims in (decode[0], prefill[0]):
        jitted, static, dyn = forwards[dims]
        texts[dims[3]] = jitted.lower(*static, *dyn).compile().as_text()
    assert _ynn_products(texts[True]) == 0
    assert _ynn_products(texts[False]) > 0
