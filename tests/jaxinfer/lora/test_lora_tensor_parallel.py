"""The adapter pool shards with the base weights: on a 2-device mesh (fake
CPU devices, in a subprocess: the device count is fixed at JAX start) A of
a row-parallel layer and B of a column-parallel one are split on heads /
mlp like their kernels, and mixed-adapter greedy tokens equal one
device's."""

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
    from jaxinfer import LLM, LoRARequest, SamplingParams
    PROMPT = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    path, adapters = sys.argv[1], json.loads(sys.argv[2])
    loras = [None] + [LoRARequest(n, i + 1, p)
                      for i, (n, p) in enumerate(adapters.items())]
    llm = LLM(path, num_gpu_blocks_override=64, max_model_len=128,
              tensor_parallel_size=2, enable_lora=True, max_loras=3,
              max_lora_rank=8, dtype="float32", compilation_cache_dir="")
    pool = llm.llm_engine.runner.lora.pool.arrays["layers_0"]
    out = {
        "tokens": [o.outputs[0].token_ids for o in llm.generate(
            [PROMPT] * len(loras), SamplingParams(max_tokens=8, temperature=0),
            lora_request=loras, use_tqdm=False)],
        "specs": {name: [list(pool[mod][name][leaf].sharding.spec)
                         for leaf in ("lora_a", "lora_b")]
                  for mod, name in (("self_attn", "q_proj"),
                                    ("self_attn", "o_proj"),
                                    ("mlp", "down_proj"))},
    }
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
def test_two_device_mesh_matches_one_device(base_path, adapters, lora_llm):
    from jaxinfer import LoRARequest, SamplingParams
    loras = [None] + [LoRARequest(n, i + 1, p)
                      for i, (n, p) in enumerate(adapters.items())]
    one_device = [o.outputs[0].token_ids for o in lora_llm.generate(
        [{"prompt_token_ids": [5, 6, 7, 8, 9]}] * len(loras),
        SamplingParams(max_tokens=8, temperature=0), lora_request=loras,
        use_tqdm=False)]
    assert len({tuple(t) for t in one_device}) == len(loras)  # all differ
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, base_path, json.dumps(adapters)],
        capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    assert res["tokens"] == one_device
    specs = res["specs"]
    # Column-parallel q_proj: A [D, slots, r] whole, B [slots, r, N, H] on heads.
    assert specs["q_proj"] == [[None, None, None],
                               [None, None, "model", None]]
    # Row-parallel o_proj / down_proj: A split on its input, B whole.
    assert specs["o_proj"] == [["model", None, None, None], [None, None, None]]
    assert specs["down_proj"] == [["model", None, None], [None, None, None]]
