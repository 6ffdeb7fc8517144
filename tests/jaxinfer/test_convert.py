"""`jaxinfer convert`: an orbax checkpoint that loads and generates the same."""

import json
import os

import jax.numpy as jnp
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.cli import main
from jaxinfer.models import CheckpointError, resolve_model

PROMPTS = ["Hello there, how are you doing", "x", "The capital of France is"]
SP = SamplingParams(max_tokens=8, temperature=0)
KW = dict(num_gpu_blocks_override=64, max_model_len=128)


def _greedy(model, **kw):
    llm = LLM(model, **KW, **kw)
    return llm, [o.outputs[0].token_ids
                 for o in llm.generate(PROMPTS, SP, use_tqdm=False)]


@pytest.fixture(scope="module")
def converted(tiny_model_factory, tmp_path_factory):
    src = tiny_model_factory("qwen2")  # biases and tied embeddings too
    out = str(tmp_path_factory.mktemp("orbax") / "m")
    assert main(["convert", "--model", src, "--output", out]) == 0
    return src, out


def test_converted_model_generates_the_same_tokens(converted):
    src, out = converted
    files = resolve_model(out)
    assert files.format == "orbax" and files.reader is None
    assert files.config == resolve_model(src).config
    _, want = _greedy(src)
    llm, got = _greedy(out)
    assert got == want
    assert llm.llm_engine.runner.params["layers_0"]["self_attn"]["q_proj"][
        "bias"].dtype == jnp.float32


def test_convert_to_bfloat16_records_the_dtype(converted, tmp_path):
    src, _ = converted
    out = str(tmp_path / "bf16")
    assert main(["convert", "--model", src, "--output", out,
                 "--dtype", "bfloat16"]) == 0
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    llm = LLM(out, **KW)  # dtype auto -> bfloat16 from config.json
    assert llm.llm_engine.runner.params["embedding"].dtype == jnp.bfloat16


def test_refuses_a_non_empty_output(converted):
    src, out = converted
    assert main(["convert", "--model", src, "--output", out]) == 2


def test_params_of_another_config_are_a_checkpoint_error(converted, tmp_path):
    _, out = converted
    with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
    bad = tmp_path / "bad"
    bad.mkdir()
    os.symlink(os.path.join(out, "params"), bad / "params")
    hf["intermediate_size"] *= 2  # the checkpoint's shapes no longer fit
    (bad / "config.json").write_text(json.dumps(hf))
    for name in os.listdir(out):
        if name.startswith("tokenizer") or name.endswith(".jinja"):
            os.symlink(os.path.join(out, name), bad / name)
    with pytest.raises(CheckpointError, match=r"\['mlp'\]\['down_proj'\]\['kernel'\] "
                       r"has shape \(128, 64\), but config.json implies \(256, 64\)"):
        LLM(str(bad), **KW)
