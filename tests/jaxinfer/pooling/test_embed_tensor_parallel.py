"""Pooling on a 2-device mesh (fake CPU devices, in a subprocess: the
device count is fixed at JAX start) gives HF's embeddings within 1e-5,
chunked prefill included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from .embedders import hf_embeddings, make_embedder

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import LLM
    path, prompts = sys.argv[1], json.loads(sys.argv[2])
    llm = LLM(path, runner="pooling", tensor_parallel_size=2, dtype="float32",
              max_model_len=128, max_num_batched_tokens=16, max_num_seqs=4,
              num_gpu_blocks_override=64, compilation_cache_dir="")
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    print("RESULT" + json.dumps([o.outputs.embedding for o in outs]))
""")


@pytest.mark.slow
def test_two_device_mesh_equals_hf(tiny_model_factory, tmp_path):
    path = make_embedder(tiny_model_factory(), str(tmp_path / "m"), "MEAN", True)
    prompts = [list(range(3, 43)), [7, 8, 9]]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, path, json.dumps(prompts)],
        capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    got = json.loads(line[len("RESULT"):])
    want = hf_embeddings(path, prompts, "MEAN", True)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5, rtol=0)
