"""`jaxinfer convert MODEL --output DIR --quantization ...`: the quantized
params written as an orbax checkpoint come back bit for bit, in their own
dtypes, and generate what the direct load generates."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.cli import main
from jaxinfer.models import load_params, resolve_model
from jaxinfer.models.quantization import QuantizationMismatchError

KW = dict(num_gpu_blocks_override=32, max_model_len=64)
SP = SamplingParams(max_tokens=6, temperature=0)
PROMPTS = ["Hello there, how are you doing", "The capital of France is"]


def _leaves(params):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in
            jax.tree_util.tree_flatten_with_path(params)[0]}


def _assert_bit_identical(got, want):
    got, want = _leaves(got), _leaves(want)
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert g.tobytes() == w.tobytes(), name


@pytest.fixture(scope="module")
def float_dir(tiny_model_factory):
    return tiny_model_factory("qwen2")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_quantized_while_converting_round_trips(float_dir, tmp_path, method):
    out = str(tmp_path / method)
    # MODEL positionally, as vLLM's commands take it
    assert main(["convert", float_dir, "--output", out, "--quantization",
                 method, "--dtype", "bfloat16"]) == 0
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)["quantization_config"]
    assert (saved["quant_method"], saved["checkpoint_format"]) == (
        method, "jaxinfer")
    files = resolve_model(out)
    assert files.format == "orbax" and files.config.quantization.method == method
    llm = LLM(out, **KW)
    direct = load_params(resolve_model(float_dir, quantization=method),
                         jnp.bfloat16)
    _assert_bit_identical(llm.llm_engine.runner.params, direct)
    want = LLM(float_dir, quantization=method, dtype="bfloat16", **KW)
    assert ([o.outputs[0].token_ids for o in llm.generate(PROMPTS, SP,
                                                           use_tqdm=False)]
            == [o.outputs[0].token_ids for o in want.generate(
                PROMPTS, SP, use_tqdm=False)])


@pytest.mark.slow
def test_an_awq_checkpoint_converts_as_it_is(float_dir, tmp_path):
    from tests.models.quant_checkpoints import write_awq
    awq = str(tmp_path / "awq")
    write_awq(float_dir, awq)
    out = str(tmp_path / "awq-orbax")
    assert main(["convert", "--model", awq, "--output", out]) == 0
    llm = LLM(out, **KW)
    _assert_bit_identical(llm.llm_engine.runner.params,
                          load_params(resolve_model(awq), jnp.float32))
    assert llm.llm_engine.runner.params["layers_0"]["mlp"]["up_proj"][
        "scales"].dtype == jnp.float16
    with pytest.raises(QuantizationMismatchError, match="'awq'"):
        LLM(out, quantization="gptq", **KW)


@pytest.mark.slow
def test_a_gguf_kept_quantized_converts_with_its_block_types(
        tiny_model_factory, tmp_path, monkeypatch):
    from tests.models.gguf_blocks import write_quantized_llama_gguf
    monkeypatch.setenv("JAXINFER_WEIGHT_CACHE_DIR", "")
    hf_dir = tiny_model_factory("llama", hidden_size=256,
                                intermediate_size=512)
    path = str(tmp_path / "m.gguf")
    kinds = ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "F32"]
    names: dict = {}
    write_quantized_llama_gguf(
        hf_dir, path, lambda n: names.setdefault(n, kinds[len(names) % 5]),
        tokenizer=True)
    from jaxinfer.entrypoints.convert import convert
    out = convert(path, str(tmp_path / "gguf-orbax"), quantization="gguf")
    files = resolve_model(out)
    saved, direct = (files.config.quantization,
                     resolve_model(path, quantization="gguf").config.quantization)
    assert (saved.method, saved.checkpoint_format) == ("gguf", "jaxinfer")
    assert saved.overrides == direct.overrides  # every layer's block type
    from jaxinfer.models import model_class
    from jaxinfer.models.orbax_checkpoint import restore_params
    model = model_class(files.config.architecture)(files.config)
    _assert_bit_identical(
        restore_params(out, model, files.config, jnp.float32),
        load_params(resolve_model(path, quantization="gguf"), jnp.float32))


@pytest.mark.slow
def test_an_unquantized_conversion_refuses_a_quantization(float_dir, tmp_path):
    out = str(tmp_path / "plain")
    assert main(["convert", float_dir, "--output", out]) == 0
    with pytest.raises(QuantizationMismatchError,
                       match="converted without quantization"):
        resolve_model(out, quantization="int8")
    assert main(["convert", float_dir, "--output", str(tmp_path / "x"),
                 "--quantization", "bitsandbytes"]) == 2
