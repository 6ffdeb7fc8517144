"""GPU smoke of the merged kernels through the whole engine: a mid-size
random (load_format=dummy) llama with head_dim 128, bf16 or AWQ int4
weights, bf16 or fp8 KV pages; 32 token-id prompts of 100-1000 tokens, 128
greedy tokens each. Reports wall time, output tok/s and the token agreement
of fp8 pages with bf16 pages. Each engine runs in its own process (a
fault in one does not end the others). Writes $OUT/engine-quant-smoke.json.

    python3 benchmarks/engine_quant_smoke.py OUT_DIR TOKENIZER_DIR

Environment: GMU=0.5 (gpu_memory_utilization), RUNS (weights:kv:route,
... instead of all five engines), SMOKE=1 (tiny shapes: a CPU
check of the script), BISECT=default,v10,ws2,triton (bf16 weights with fp8
pages only, once per fp8 decode route; prints RESULT lines, writes no file).
Results: benchmarks/results/engine-quant-smoke-h200.json (and its -capped
and -warm siblings).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

OUT = sys.argv[1]
TOK = sys.argv[2]  # a tokenizer folder (.tok)
base = dict(architectures=["LlamaForCausalLM"], model_type="llama",
            hidden_size=2048, intermediate_size=5632, num_attention_heads=16,
            num_key_value_heads=4, head_dim=128, num_hidden_layers=8,
            vocab_size=49152, max_position_embeddings=4096, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False,
            torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
SMOKE = os.environ.get("SMOKE") == "1"  # tiny shapes, CPU check of the script
if SMOKE:
    base.update(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, num_hidden_layers=2)
awq = dict(base, quantization_config=dict(quant_method="awq", bits=4,
                                          group_size=128, zero_point=True,
                                          version="gemm"))


def folder(cfg):
    d = tempfile.mkdtemp()
    for f in os.listdir(TOK):
        if f != "config.json":
            shutil.copy(os.path.join(TOK, f), d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


from jaxinfer import LLM, SamplingParams

rng = np.random.default_rng(0)
prompts = [{"prompt_token_ids": rng.integers(3, 49152, int(n)).tolist()}
           for n in (rng.integers(10, 40, 4) if SMOKE
                     else rng.integers(100, 1000, 32))]
sp = SamplingParams(max_tokens=8 if SMOKE else 128, temperature=0,
                    ignore_eos=True)
def one(wname, kv):
    """One engine in this process; prints its row as JSON (last line)."""
    path = folder(awq if wname == "awq" else base)
    row = dict(weights=wname, kv_cache_dtype=kv)
    llm = LLM(path, load_format="dummy", dtype="bfloat16", seed=0,
              kv_cache_dtype=kv, max_model_len=2048, max_num_seqs=32,
              max_num_batched_tokens=2048, warmup=False,
              # The second pass repeats the prompts: with prefix caching its
              # steps would have new shapes and build programs again.
              enable_prefix_caching=False,
              gpu_memory_utilization=float(os.environ.get("GMU", "0.5")))
    r = llm.llm_engine.runner
    row["scheme_kernel"] = getattr(getattr(getattr(
        r.cfg, "quantization", None), "scheme", None), "kernel", None)
    row["kv_page_dtype"] = str(r.kv_dtype)
    # warmup=False: the first pass also builds each step program it meets;
    # the second pass over the same prompts runs on built programs.
    for key in ("first_pass", "warm"):
        t = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        row[f"{key}_wall_s"] = time.perf_counter() - t
        row["tokens"] = [o.outputs[0].token_ids for o in outs]
        row[f"{key}_output_tok_s"] = (sum(map(len, row["tokens"]))
                                      / row[f"{key}_wall_s"])
    row["kv_pages"] = int(r.num_blocks)
    print(json.dumps(row))


def fp8_variant(name):
    """Patches the fp8 decode route: "default" (FP8_MOSAIC_DECODE),
    "v10" (the 16-bit pages' Mosaic tuning), "ws2" (two producers, 64-token
    steps), "triton" (fp8 pages on the Triton kernel)."""
    from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
    from jaxinfer.pallas_kernels import ragged_paged_attention_tuning as t
    if name == "v10":
        t.FP8_MOSAIC_DECODE = t.MosaicDecodeTuning()
    elif name == "ws2":
        t.FP8_MOSAIC_DECODE = t.MosaicDecodeTuning(fp8_producers=2)
    elif name == "triton":
        real = mg.supports
        mg.supports = lambda q, kv, *a, **k: (
            "fp8 on triton (smoke)" if jnp.dtype(kv).itemsize == 1
            else real(q, kv, *a, **k))


if len(sys.argv) > 3:  # a child: one engine
    import jax.numpy as jnp
    fp8_variant(os.environ.get("FP8_VARIANT", "default"))
    one(sys.argv[3], sys.argv[4])
    sys.exit(0)
if os.environ.get("BISECT"):
    import subprocess
    for v in os.environ["BISECT"].split(","):
        p = subprocess.run([sys.executable, __file__, OUT, TOK, "bf16", "fp8"],
                           capture_output=True, text=True,
                           env=dict(os.environ, FP8_VARIANT=v))
        lines = p.stdout.strip().splitlines()
        ok = p.returncode == 0 and lines
        res = {k: v2 for k, v2 in json.loads(lines[-1]).items()
               if k != "tokens"} if ok else (p.stderr[-600:])
        print("RESULT", v, "rc", p.returncode,
              str(res)[-300:].replace("\n", " "), flush=True)
    sys.exit(0)
import subprocess

from benchmarks.run_stamp import run_stamp

rows, tokens = [], {}
# (weights, kv_cache_dtype, fp8 decode route): the default route for fp8
# pages is the Mosaic kernel; "triton" puts them on the Triton kernel.
RUNS = [("bf16", "auto", "default"), ("bf16", "fp8", "default"),
        ("bf16", "fp8", "triton"), ("awq", "auto", "default"),
        ("awq", "fp8", "default")]
if os.environ.get("RUNS"):  # e.g. RUNS=bf16:auto:default,bf16:fp8:triton
    RUNS = [tuple(r.split(":")) for r in os.environ["RUNS"].split(",")]
for wname, kv, route in RUNS:
    p = subprocess.run([sys.executable, __file__, OUT, TOK, wname, kv],
                       capture_output=True, text=True,
                       env=dict(os.environ, FP8_VARIANT=route))
    try:
        row = json.loads(p.stdout.strip().splitlines()[-1])
        tokens[(wname, kv, route)] = row.pop("tokens")
    except (ValueError, IndexError):
        row = dict(weights=wname, kv_cache_dtype=kv,
                   error=(p.stdout + p.stderr)[-2000:])
    row["fp8_route"] = route
    row["warnings"] = [ln[-300:] for ln in p.stderr.splitlines()
                       if "Warning" in ln or "capped" in ln][:5]
    print(row, flush=True)
    rows.append(row)
    base = tokens.get((wname, "auto", "default"))
    got = tokens.get((wname, kv, route))
    if kv == "fp8" and base and got:
        same = sum(x == y for p_, q in zip(base, got) for x, y in zip(p_, q))
        first = sum(p_[0] == q[0] for p_, q in zip(base, got))
        rows.append(dict(weights=wname, fp8_route=route,
                         fp8_vs_bf16_pages_token_agreement=
                         same / sum(map(len, base)), first_token_agreement=
                         first / len(base)))
        print(rows[-1], flush=True)
import jax

with open(os.path.join(OUT, "engine-quant-smoke.json"), "w") as f:
    json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                   **run_stamp(), gpu_memory_utilization=os.environ.get(
                       "GMU", "0.5"),
                   command="python3 benchmarks/engine_quant_smoke.py $OUT .tok",
                   rows=rows), f, indent=1)
