"""Tensor parallelism over quantized weights and fp8 KV pages: the packed
codes and their group scales split where the float weights split, per-page
scales split with their pages, and two fake CPU devices give the tokens of
one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import LLM, SamplingParams
    path, backend = sys.argv[1], sys.argv[2]
    prompts = ["Hello there, how are you doing", "x", "The capital of France is"]
    sp = SamplingParams(max_tokens=8, temperature=0)
    out = {}
    for tp in (1, 2):
        llm = LLM(path, num_gpu_blocks_override=64, max_model_len=128,
                  tensor_parallel_size=tp, attention_backend=backend,
                  kv_cache_dtype="fp8")
        r = llm.llm_engine.runner
        layer = r.params["layers_0"]
        spec = lambda a: [str(s) for s in a.sharding.spec]
        out[tp] = {
            "tokens": [o.outputs[0].token_ids
                       for o in llm.generate(prompts, sp, use_tqdm=False)],
            "q_qweight": spec(layer["self_attn"]["q_proj"]["qweight"]),
            "o_qweight": spec(layer["self_attn"]["o_proj"]["qweight"]),
            "o_scales": spec(layer["self_attn"]["o_proj"]["scales"]),
            "k_scales": spec(r.kv_pages[0][2]),
        }
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "pallas_interpret"])
def test_awq_with_fp8_pages_on_two_devices(tiny_model_factory, tmp_path,
                                           backend):
    from tests.models.quant_checkpoints import write_awq
    awq = str(tmp_path / "awq")
    write_awq(tiny_model_factory("llama"), awq, group=16)  # 64 inputs / 2 devices
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, awq, backend],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    two = res["2"]
    assert two["q_qweight"] == ["model", "None", "None"]  # column: heads
    assert two["o_qweight"] == ["None", "model"]  # row: the packed inputs
    assert two["o_scales"] == ["None", "model"]  # and their groups
    assert two["k_scales"][0] == "model"  # with the pages' kv heads
    assert two["tokens"] == res["1"]["tokens"]
