"""Tensor parallelism on real GPUs: greedy tokens of a tiny model with
tensor_parallel_size 1 and 2, reference and Pallas attention, must agree.

    export PYTHONPATH=$PWD
    python3 benchmarks/tp_check.py MODEL_DIR

(MODEL_DIR: a tiny HF folder made here by tests/tiny_models.py and carried.)
"""

import json
import sys

import jax

from jaxinfer import LLM, SamplingParams

print(jax.devices())
path = sys.argv[1]
prompts = ["Hello there, how are you doing today? " * 4, "x", "The capital of France is"]
sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
res = {}
for tp, backend in ((1, "reference"), (1, "pallas"), (2, "pallas"), (2, "reference")):
    llm = LLM(path, tensor_parallel_size=tp, attention_backend=backend,
              num_gpu_blocks_override=64, max_model_len=256, max_num_batched_tokens=32)
    r = llm.llm_engine.runner
    res[f"tp{tp}-{backend}"] = dict(
        tokens=[o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)],
        kv_devices=len(r.kv_pages[0][0].sharding.device_set),
        kv_spec=list(r.kv_pages[0][0].sharding.spec))
    del llm
base = res["tp1-reference"]["tokens"]
for k, v in res.items():
    print(k, "devices", v["kv_devices"], v["kv_spec"], "equal to tp1-reference:",
          v["tokens"] == base)
print("RESULT" + json.dumps(res))
