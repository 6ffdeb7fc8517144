"""Tensor parallelism: partition rules, and a 2-device mesh (fake CPU
devices, in a subprocess because the device count is fixed at JAX start)
giving the same greedy tokens as one device."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxinfer.sharding import make_mesh, param_shardings


def _abstract(tiny_path):
    from jaxinfer.models import model_class, resolve_model
    from jaxinfer.models.abstract import abstract_variables
    cfg = resolve_model(tiny_path).config
    return abstract_variables(model_class(cfg.architecture)(cfg), cfg)["params"]


def test_rules_give_column_and_row_parallel_specs(tiny_model_factory):
    # A mesh of one device still carries the "model" axis names.
    specs = jax.tree_util.tree_map(
        lambda s: s.spec,
        param_shardings(_abstract(tiny_model_factory("llama")), make_mesh(1)))
    attn = specs["layers_0"]["self_attn"]
    assert attn["q_proj"]["kernel"] == P(None, "model", None)  # column
    assert attn["o_proj"]["kernel"] == P("model", None, None)  # row
    assert specs["layers_0"]["mlp"]["down_proj"]["kernel"] == P("model", None)
    assert specs["embedding"] == P("model", None)  # vocab-parallel
    assert specs["norm"]["scale"] == P(None)


def test_mesh_errors_name_the_device_count():
    with pytest.raises(ValueError, match="tensor_parallel_size=64 needs"):
        make_mesh(64)
    with pytest.raises(ValueError, match=">= 1"):
        make_mesh(0)


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
                  tensor_parallel_size=tp, attention_backend=backend)
        r = llm.llm_engine.runner
        out[tp] = {
            "tokens": [o.outputs[0].token_ids
                       for o in llm.generate(prompts, sp, use_tqdm=False)],
            "kv_spec": list(r.kv_pages[0][0].sharding.spec),
            "devices": len(r.params["embedding"].sharding.device_set),
        }
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.parametrize("kv_heads,backend", [(2, "reference"), (1, "reference"),
                                              (2, "pallas_interpret")])
def test_two_device_mesh_matches_one_device(tiny_model_factory, kv_heads,
                                            backend):
    """Pallas kernels run per shard (shard_map) when kv heads split."""
    path = tiny_model_factory("llama", num_key_value_heads=kv_heads)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, path, backend],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    assert res["2"]["tokens"] == res["1"]["tokens"]
    assert res["2"]["devices"] == 2
    # 2 kv heads split over 2 devices; 1 kv head is replicated.
    assert res["2"]["kv_spec"] == (["model"] if kv_heads == 2 else [])


def test_rules_split_a_fused_qkv_weight_on_kv_heads(tiny_model_factory):
    """One q/k/v weight [D, K, G + 2, H] (models/fused_qkv.py): split on kv
    heads, each shard with its kv heads' query heads, k and v."""
    import dataclasses

    from jaxinfer.models import model_class, resolve_model
    from jaxinfer.models.abstract import abstract_variables
    cfg = dataclasses.replace(
        resolve_model(tiny_model_factory("qwen2")).config, fused_qkv=True)
    abstract = abstract_variables(model_class(cfg.architecture)(cfg), cfg)
    specs = jax.tree_util.tree_map(
        lambda s: s.spec, param_shardings(abstract["params"], make_mesh(1)))
    qkv = specs["layers_0"]["self_attn"]["qkv_proj"]
    assert qkv["kernel"] == P(None, "model", None, None)
    assert qkv["bias"] == P("model", None, None)


_FUSED_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.entrypoints.convert import convert
    from jaxinfer.models import fused_qkv
    path, orbax_dir = sys.argv[1], sys.argv[2]
    prompts = ["Hello there, how are you doing", "x", "The capital of France is"]
    sp = SamplingParams(max_tokens=8, temperature=0)

    def run(model, tp, backend, fused, pp=1):
        # The engine fuses on the platforms listed (GPU by default).
        fused_qkv.DEFAULT_PLATFORMS = ("cpu",) if fused else ()
        llm = LLM(model, num_gpu_blocks_override=64, max_model_len=128,
                  tensor_parallel_size=tp, pipeline_parallel_size=pp,
                  attention_backend=backend)
        r = llm.llm_engine.runner
        layer = (r.params["slots"][0] if pp > 1 else r.params["layers_0"])
        qkv = layer["self_attn"].get("qkv_proj", {})
        return {
            "fused": r.cfg.fused_qkv,
            "tokens": [o.outputs[0].token_ids
                       for o in llm.generate(prompts, sp, use_tqdm=False)],
            "specs": {k: [str(a) for a in v.sharding.spec]
                      for k, v in qkv.items()},
        }

    convert(path, orbax_dir)
    out = {"separate": run(path, 1, "reference", False),
           "reference": run(path, 2, "reference", True),
           "pallas": run(path, 2, "pallas_interpret", True),
           "orbax": run(orbax_dir, 2, "reference", True),
           "stages": run(path, 1, "reference", True, pp=2)}
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
def test_fused_qkv_on_two_devices_matches_separate_on_one(tiny_model_factory,
                                                          tmp_path):
    """The fused weight split on kv heads over two devices (GSPMD for the
    reference attention, the Pallas kernels per shard), loaded from
    safetensors and restored from an orbax checkpoint, and over two
    pipeline stages, gives the greedy tokens of the separate weights on
    one device."""
    path = tiny_model_factory("qwen2")  # G = 2, q/k/v biases
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _FUSED_SCRIPT, path, str(tmp_path / "orbax")],
        capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    assert not res["separate"]["fused"]
    for name in ("reference", "pallas", "orbax", "stages"):
        assert res[name]["fused"], name
        assert res[name]["tokens"] == res["separate"]["tokens"], name
    for name in ("reference", "pallas", "orbax"):
        assert res[name]["specs"] == {
            "kernel": ["None", "model", "None", "None"],
            "bias": ["model", "None", "None"]}, name
    # Two pipeline stages, one device each: a slot array [stage, ...].
    assert res["stages"]["specs"]["kernel"][0] == "stage"
