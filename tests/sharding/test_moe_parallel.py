"""Mixture-of-experts models on a 2-device mesh (fake CPU devices, in a
subprocess because the device count is fixed at JAX start): experts split
by expert when the model axis divides their count (expert parallelism),
each expert's hidden axis split otherwise (tensor-parallel experts). Both
give HF transformers' greedy tokens and prefill logits within 1e-4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxinfer.sharding.rules import logical_spec
from tests.runners import HfRunner

PROMPTS = ["Hello there, how are you doing", "x",
           "The capital of France is " * 12]
MAX_TOKENS = 8
LOGITS_ATOL = 1e-4

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from tests.runners import JaxInferRunner
    path, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    ours = JaxInferRunner(path, tensor_parallel_size=2, max_model_len=256,
                          max_num_batched_tokens=32, num_gpu_blocks_override=64,
                          enable_prefix_caching=True)
    mlp = ours.engine.runner.params["layers_0"]["mlp"]
    out = {
        "tokens": [ids for ids, _ in ours.generate_greedy(prompts, max_tokens)],
        "cached": [ids for ids, _ in ours.generate_greedy(prompts, max_tokens)],
        "logits": [l.tolist() for l in ours.prefill_logits(prompts)],
        "specs": {k: [a for a in mlp[k].sharding.spec]
                  for k in ("gate_proj", "down_proj", "router")},
    }
    print("RESULT" + json.dumps(out))
""")


class _Mesh:
    shape = {"model": 2}


def test_rules_split_experts_or_their_hidden_axis():
    axes = ("experts", "embed", "mlp")
    assert logical_spec(axes, (4, 64, 128), _Mesh) == P("model", None, None)
    assert logical_spec(axes, (3, 64, 128), _Mesh) == P(None, None, "model")
    assert logical_spec(axes, (3, 64, 5), _Mesh) == P(None, None, None)


@pytest.mark.slow
@pytest.mark.parametrize("arch,overrides,split", [
    ("mixtral", {}, "experts"),  # 4 experts over 2 devices
    ("qwen3_moe", {"num_experts": 3, "norm_topk_prob": True}, "mlp"),
])
def test_two_devices_match_hf(tiny_model_factory, arch, overrides, split):
    path = tiny_model_factory(arch, **overrides)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, path, json.dumps(PROMPTS),
         str(MAX_TOKENS)],
        capture_output=True, text=True, env=env, timeout=900, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    if split == "experts":
        assert res["specs"]["gate_proj"] == ["model", None, None]
        assert res["specs"]["down_proj"] == ["model", None, None]
    else:
        assert res["specs"]["gate_proj"] == [None, None, "model"]
        assert res["specs"]["down_proj"] == [None, "model", None]
    assert res["specs"]["router"] == [None, None]
    hf = HfRunner(path)
    want = [ids for ids, _ in hf.generate_greedy(PROMPTS, MAX_TOKENS)]
    assert res["tokens"] == want
    assert res["cached"] == want
    logits = hf.prefill_logits([hf.encode(p) for p in PROMPTS])
    assert max(float(np.abs(np.asarray(g) - w).max())
               for g, w in zip(res["logits"], logits)) < LOGITS_ATOL
