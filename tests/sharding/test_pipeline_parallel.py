"""Tensor, pipeline and data parallelism on fake CPU devices (a subprocess:
the device count is fixed when JAX starts) give the greedy tokens of one
device, with every param and page where the layout says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + sys.argv[3]
    import jax
    from jaxinfer import LLM, SamplingParams
    path, configs = sys.argv[1], json.loads(sys.argv[2])
    prompts = ["Hello there, how are you doing", "x",
               "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17"]
    greedy = SamplingParams(max_tokens=6, temperature=0)
    seeded = SamplingParams(max_tokens=6, temperature=0.9, top_k=20, seed=7)

    def layout(runner):
        params = runner.params
        if "slots" not in params:  # no pipeline stages
            q = params["layers_0"]["self_attn"]["q_proj"]["kernel"]
            return {"q_spec": [str(a) for a in q.sharding.spec],
                    "q_devices": sorted(d.id for d in q.sharding.device_set)}
        q = params["slots"][0]["self_attn"]["q_proj"]["kernel"]
        # (stage index held, device) of every shard: one layer per device.
        held = sorted((s.index[0].start, s.device.id, s.data.shape[0])
                      for s in q.addressable_shards)
        mesh = runner.placement.mesh
        return {"q_spec": [str(a) for a in q.sharding.spec],
                "q_shape": list(q.shape), "held": held,
                "stages": [[int(d.id) for d in row] for row in mesh.devices[0]],
                "embed_spec": [str(a) for a in
                               params["shared"]["embedding"].sharding.spec],
                "slots": len(params["slots"])}

    out = {}
    for name, kw in configs.items():
        with_seeded = kw.pop("seeded", False)
        llm = LLM(path, num_gpu_blocks_override=32, max_model_len=64,
                  compilation_cache_dir="", **kw)
        engine = llm.llm_engine
        replicas = getattr(engine, "replicas", [engine])
        res = {
            "greedy": [o.outputs[0].token_ids
                       for o in llm.generate(prompts, greedy, use_tqdm=False)],
            "seeded": with_seeded and [
                o.outputs[0].token_ids
                for o in llm.generate(prompts, seeded, use_tqdm=False)],
            "kv_spec": [str(a) for a in
                        replicas[0].runner.kv_pages[0][0].sharding.spec],
            "kv_shape": list(replicas[0].runner.kv_pages[0][0].shape),
            "layouts": [layout(r.runner) for r in replicas],
        }
        out[name] = res
        del llm, engine, replicas
    print("RESULT" + json.dumps(out))
""")


def _run(path: str, configs: dict, devices: int, timeout: int = 900) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, path,
                           json.dumps(configs), str(devices)],
                          capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Every program built ahead on the mesh (none fell back to a build on
    # first use, as when the model's constants sat on one device).
    assert "ahead failed" not in proc.stderr, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.slow
def test_tp_pp_dp_match_one_device_on_a_tiny_model(tiny_model_factory):
    # 4 layers (2 per stage), 4 heads, 2 kv heads (TP=4 replicates them).
    path = tiny_model_factory("llama", num_hidden_layers=4)
    # (TP=2 alone: test_tensor_parallel.py; DP alone is DP x TP=1.)
    res = _run(path, {
        "one": {"seeded": True},
        "tp4": {"tensor_parallel_size": 4},
        "pp2": {"pipeline_parallel_size": 2},
        "tp2pp2": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2,
                   "seeded": True},
        "dp2tp2": {"data_parallel_size": 2, "tensor_parallel_size": 2,
                   "seeded": True},
    }, devices=4)
    for name, r in res.items():
        assert r["greedy"] == res["one"]["greedy"], name
        if r["seeded"]:
            assert r["seeded"] == res["one"]["seeded"], name

    assert res["tp4"]["kv_spec"] == []  # 2 kv heads over 4 devices: copied
    assert res["tp4"]["layouts"][0]["q_devices"] == [0, 1, 2, 3]

    pp2 = res["pp2"]["layouts"][0]
    # Slot arrays [pp, D, N, H]: stage 0 holds layer 0 of the pair, stage
    # 1 layer 2, each device one layer's slice, nothing copied across stages.
    assert pp2["q_spec"] == ["stage", "None", "model", "None"]
    assert pp2["q_shape"][0] == 2 and pp2["slots"] == 2
    assert pp2["held"] == [[0, 0, 1], [1, 1, 1]]
    assert pp2["embed_spec"][0] == "('stage', 'model')"  # vocab over both
    assert res["pp2"]["kv_spec"][0] == "stage"
    assert res["pp2"]["kv_shape"][0] == 2  # [pp, K, pages, B, H]

    both = res["tp2pp2"]["layouts"][0]
    assert both["stages"] == [[0, 1], [2, 3]]
    assert both["held"] == [[0, 0, 1], [0, 1, 1], [1, 2, 1], [1, 3, 1]]
    assert res["tp2pp2"]["kv_spec"] == ["stage", "model"]

    # Replicas on disjoint devices.
    assert [l["q_devices"] for l in res["dp2tp2"]["layouts"]] == [[0, 1],
                                                                   [2, 3]]


@pytest.mark.slow
def test_tp_x_pp_matches_one_device_on_the_embedded_model():
    """SmolLM2-135M: 30 layers, 9 heads, 3 kv heads (so TP=3, not 2 or 4,
    divides them); tied embeddings, so the pipelined head reads the
    embedding. (DP replicas are whole one-device engines: the tiny model
    shows they match.)"""
    res = _run("smollm2-135m-instruct", {
        "one": {},
        "tp3pp2": {"tensor_parallel_size": 3, "pipeline_parallel_size": 2},
    }, devices=6, timeout=1500)
    for name, r in res.items():
        assert r["greedy"] == res["one"]["greedy"], name
    assert res["tp3pp2"]["kv_spec"] == ["stage", "model"]
    assert len(res["tp3pp2"]["layouts"][0]["held"]) == 6
