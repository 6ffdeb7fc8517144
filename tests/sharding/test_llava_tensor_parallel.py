"""LLaVA under tensor parallelism: the vision tower and projector take the
same partition rules as the decoder (column-parallel q/k/v and fc1,
row-parallel out_proj and fc2), and on 2 fake CPU devices (a subprocess:
the device count is fixed when JAX starts) greedy tokens of image prompts
equal one device's."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from jax.sharding import PartitionSpec as P


def test_the_tower_is_split_like_the_decoder(tiny_llava_path):
    import jax

    from jaxinfer.models import model_class, resolve_model
    from jaxinfer.models.abstract import abstract_variables
    from jaxinfer.sharding import make_mesh, param_shardings
    cfg = resolve_model(tiny_llava_path, "dummy").config
    abstract = abstract_variables(model_class(cfg.architecture)(cfg), cfg)
    specs = jax.tree_util.tree_map(
        lambda s: s.spec, param_shardings(abstract["params"], make_mesh(1)))
    layer = specs["vision_tower"]["layers_0"]
    assert layer["self_attn"]["q_proj"]["kernel"] == P(None, "model", None)
    assert layer["self_attn"]["out_proj"]["kernel"] == P("model", None, None)
    assert layer["mlp"]["fc1"]["kernel"] == P(None, "model")
    assert specs["multi_modal_projector"]["linear_2"]["kernel"] == P("model", None)
    assert specs["language_model"]["embedding"] == P("model", None)


_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    sys.path.insert(0, os.getcwd())
    from jaxinfer import LLM, SamplingParams
    from tests.tiny_llava import random_image
    prompts = [{"prompt": "USER: <image>\\nWhat is it? ASSISTANT:",
                "multi_modal_data": {"image": random_image(1)}},
               "Hello there",
               {"prompt": "<image> and <image>",
                "multi_modal_data": {"image": [random_image(2), random_image(3)]}}]
    out = {}
    for tp in (1, 2):
        llm = LLM(sys.argv[1], dtype="float32", max_model_len=128,
                  max_num_seqs=4, max_num_batched_tokens=32,
                  tensor_parallel_size=tp, compilation_cache_dir="")
        res = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8),
                           use_tqdm=False)
        out[tp] = [list(r.outputs[0].token_ids) for r in res]
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_two_devices_give_one_devices_tokens(tiny_llava_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", _SCRIPT, tiny_llava_path],
                       capture_output=True, text=True, cwd=root, timeout=600,
                       env={**os.environ, "PYTHONPATH": root})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["1"] == out["2"]
    assert all(len(t) == 8 for t in out["1"])
