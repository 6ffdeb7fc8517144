"""Decode-only step programs on CPU compile with their own XLA options
(jaxinfer/worker/compile_options.py)."""

from __future__ import annotations

import pytest

from jaxinfer.worker import compile_options
from jaxinfer.worker.buckets import Bucket
from jaxinfer.worker.compile_options import CPU_DECODE_OPTIONS, decode_compile_options


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


def test_few_row_buckets_compile_products_outside_ynnpack(make_llm):
    """Warm-up's program for each decode-only bucket of DECODE_OPTIONS_ROWS
    sequences and each prefill bucket of at most PREFILL_OPTIONS_MAX_TOKENS
    tokens is the runner's few-row forward, whose products compile to
    XLA's own dots; wider prefill buckets keep YNNPACK's (the default
    compile)."""
    from jaxinfer.worker.warmup import wanted_programs
    # Steps of up to 64 tokens: prefill buckets of 16, 32 and 64.
    runner = make_llm(max_num_batched_tokens=64).llm_engine.runner
    programs = runner.programs
    if programs.decode_options is None:
        pytest.skip("no decode options on this platform or jaxlib")
    forwards = {key[1]: todo for key, todo in wanted_programs(
                    programs, runner.device_state()).items()
                if key[0] == "forward"}
    decode = [dims for dims in forwards if dims[3] and dims[1] >= 4]
    cap = compile_options.PREFILL_OPTIONS_MAX_TOKENS
    small = [dims for dims in forwards if not dims[3] and dims[0] <= cap]
    wide = [dims for dims in forwards if not dims[3] and dims[0] > cap]
    assert decode and small and wide
    lo, hi = compile_options.DECODE_OPTIONS_ROWS
    for dims, (jitted, _, _) in forwards.items():
        assert jitted is programs.forward_program(dims)
        assert (jitted is programs._forward_few_rows) == (
            lo <= dims[1] <= hi if dims[3] else dims[0] <= cap)
    # Decode buckets outside the measured rows keep the default compile.
    for rows in (lo - 1, hi * 2):
        assert programs.forward_program(Bucket(rows, rows, 4, True)) is \
            programs._forward
    texts = {}
    for dims in (decode[0], small[0], wide[0]):
        jitted, static, dyn = forwards[dims]
        texts[dims] = jitted.lower(*static, *dyn).compile().as_text()
    assert _ynn_products(texts[decode[0]]) == 0
    assert _ynn_products(texts[small[0]]) == 0
    assert _ynn_products(texts[wide[0]]) > 0
