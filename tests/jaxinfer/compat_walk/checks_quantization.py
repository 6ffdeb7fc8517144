"""Checks of the quantization rows on the walk's tiny model.
Exact packing, accuracy bounds and the quantized checkpoint formats are
proved in tests/models/test_quantize_at_load.py, test_quantized_*.py and
test_gguf_quantized.py; here each row changes what the engine holds and
what it computes."""

from __future__ import annotations

import jax.numpy as jnp

from jaxinfer import SamplingParams

from .registry import row_check

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPT = {"prompt_token_ids": [5, 60, 7, 33, 80, 21]}


def _q_proj(llm):
    return llm.llm_engine.runner.params["layers_0"]["self_attn"]["q_proj"]


@row_check("engine_args", "quantization")
def quantization_stores_int8_weights(make_llm):
    base = make_llm()
    assert "kernel" in _q_proj(base)
    llm = make_llm(quantization="int8")
    q = _q_proj(llm)
    assert q["weight"].dtype == jnp.int8 and "kernel" not in q
    out = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4


@row_check("engine_args", "kv_cache_dtype")
def fp8_pages_hold_one_byte_per_entry(make_llm):
    """fp8 pages (and their per-page scales) in the pool, each page a
    quarter of the float32 model's bytes plus its scales: the memory
    planner fits that many more into the same budget."""
    base = make_llm()
    fp8 = make_llm(kv_cache_dtype="fp8")
    pages = fp8.llm_engine.runner.kv_pages[0]
    assert pages[0].dtype == jnp.float8_e4m3fn and len(pages) == 4  # + scales
    assert fp8.llm_engine.runner.page_bytes < base.llm_engine.runner.page_bytes / 2
    out = fp8.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4


@row_check("serve_flags", "quantization", "kv_cache_dtype")
def quantization_serve_flags_reach_the_engine(rows):
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    args = serve_engine_args(build_parser().parse_args(
        ["serve", "m", "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3"]))
    assert (args.quantization, args.kv_cache_dtype) == ("fp8", "fp8_e4m3")
