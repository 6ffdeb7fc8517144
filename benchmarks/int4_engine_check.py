"""The engine on an AWQ checkpoint on one GPU: the runner's choice of the
Pallas int4 kernel (methods.with_int4_kernel) against XLA's
dequantize-then-dot, greedy tokens and ms per decode token, batch 1.

    export PYTHONPATH=$PWD
    python3 benchmarks/int4_engine_check.py --out $OUT [--layers 2]

llama3-8b's layer shapes with ``--layers`` layers, AWQ 4-bit groups of 128,
random weights (``load_format="dummy"``), bf16; the tokenizer of the
embedded model saved in ``.tok`` (carried). Writes int4-engine.json.

The check is the tokens and the runner's choice. The ms per token of the
first run (int4-engine-h200.json: about 100 ms for 4 layers, both paths)
are not step times and were not investigated (programs built inside the
timed call are the likely cause); quant_step.py measures speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks.run_stamp import run_stamp

HERE = os.path.dirname(os.path.abspath(__file__))
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128,
       "zero_point": True, "version": "gemm"}


def make_folder(layers: int, tokenizer: str) -> str:
    dst = tempfile.mkdtemp(prefix="awq-llama3-8b-")
    with open(os.path.join(HERE, "models", "llama3-8b", "config.json")) as f:
        cfg = json.load(f)
    cfg.update(num_hidden_layers=layers, quantization_config=AWQ,
               model_type="llama", torch_dtype="float16")
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    for name in os.listdir(tokenizer):
        if name != "config.json":
            shutil.copy(os.path.join(tokenizer, name), dst)
    return dst


def run(folder: str, tokens: int) -> dict:
    from jaxinfer import LLM, SamplingParams
    llm = LLM(folder, load_format="dummy", dtype="bfloat16", max_model_len=512,
              max_num_seqs=4, warmup=False, seed=0,
              gpu_memory_utilization=0.3)  # two engines in turn
    sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(1000, 1100))}
    llm.generate([prompt], sp)  # every program this run needs is built
    t0 = time.perf_counter()
    out = llm.generate([prompt], sp)[0].outputs[0].token_ids
    wall = time.perf_counter() - t0
    kernel = llm.llm_engine.runner.cfg.quantization.scheme.kernel
    del llm
    import gc
    gc.collect()
    return dict(kernel=kernel, tokens=out, wall_s=wall,
                ms_per_token=wall / tokens * 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tokenizer", default=".tok")
    args = ap.parse_args()
    folder = make_folder(args.layers, args.tokenizer)
    rows = [run(folder, args.tokens)]  # the runner's own choice
    from jaxinfer.worker import model_runner
    model_runner.with_int4_kernel = lambda cfg, n, platform: cfg  # XLA's
    rows.append(run(folder, args.tokens))
    same = sum(a == b for a, b in zip(rows[0]["tokens"], rows[1]["tokens"]))
    out = dict(workload="int4-engine", layers=args.layers, **run_stamp(),
               command="python3 benchmarks/int4_engine_check.py --out $OUT "
               f"--layers {args.layers}", rows=rows,
               same_greedy_tokens=same, of=args.tokens)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "int4-engine.json"), "w") as f:
        json.dump(out, f, indent=1)
    for r in rows:
        print(f"kernel={r['kernel']:7} {r['ms_per_token']:.2f} ms/token "
              f"first tokens {r['tokens'][:8]}")
    print(f"same greedy tokens: {same} of {args.tokens}")


if __name__ == "__main__":
    main()
