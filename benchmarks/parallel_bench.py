"""Parallel layouts against one device, in one
command.

    export PYTHONPATH=$PWD
    python3 benchmarks/parallel_bench.py --model benchmarks/models/llama3-8b \\
        --load-format dummy --tokenizer smollm2-135m-instruct \\
        --out benchmarks/results/parallel-h200x2.json

Each layout (``--layouts``, default ``tp1 tp2 pp2 dp2``; also ``tp4``,
``tp2pp2``, ``dp2tp2``, ...) runs in a process of its own, so each starts
with every device free. Per layout:

- ``tokens``: greedy tokens of a few prompts (every layout must equal tp1's;
  with ``--load-format dummy`` the weights are the same random draw
  everywhere, as each param's draw depends only on the seed and its index);
- ``decode_step_ms``: the median device time of the decode-only steps while
  ``--decode-batch`` sequences decode (the step timeline);
- ``throughput``: ``--num-prompts`` prompts of ``--input-len`` random tokens,
  ``--output-len`` tokens each (ignore_eos), run once untimed (compiles),
  then timed.

The summary compares TP=2 with TP=1 (tokens, decode step, output tokens/s),
PP=2 with TP=2, and DP=2 with twice TP=1's throughput (two independent
one-device engines, ideally). A CPU smoke run on fake devices:

    python3 benchmarks/parallel_bench.py --cpu-devices 4 \\
        --model benchmarks/models/tiny-llama --load-format dummy \\
        --tokenizer smollm2-135m-instruct --num-prompts 8 --input-len 16 \\
        --output-len 8 --decode-batch 4 --decode-steps 8 --out /tmp/parallel.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

LAYOUT = re.compile(r"(tp|pp|dp)(\d+)")
FLAG = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size",
        "dp": "data_parallel_size"}
PROMPTS = ["The capital of France is", "Hello, my name is",
           "1 2 3 4 5 6 7 8 9 10 11 12"]


def layout_kwargs(name: str) -> dict:
    parts = LAYOUT.findall(name)
    if not parts or "".join(k + n for k, n in parts) != name:
        raise SystemExit(f"bad layout {name!r}: write e.g. tp2, pp2, dp2, tp2pp2")
    return {FLAG[k]: int(n) for k, n in parts}


def _decode_ms(records, batch: int) -> float | None:
    times = [r.device_ms for r in records if r.decode_only and r.S >= batch]
    return statistics.median(times) if times else None


def measure(ns, name: str) -> dict:
    """One layout, in this process (run by the parent as a child)."""
    import jax
    import numpy as np

    from jaxinfer import LLM, SamplingParams
    llm = LLM(ns.model, load_format=ns.load_format, tokenizer=ns.tokenizer,
              max_model_len=ns.max_model_len, dtype=ns.dtype,
              max_num_seqs=ns.max_num_seqs, warmup=ns.warmup,
              profile_steps=os.path.join(ns.tmp, f"{name}.steps.jsonl"),
              **layout_kwargs(name))
    engine = llm.llm_engine
    replicas = getattr(engine, "replicas", [engine])
    greedy = SamplingParams(max_tokens=ns.greedy_tokens, temperature=0)
    tokens = [o.outputs[0].token_ids
              for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]

    rng = np.random.default_rng(0)
    vocab = engine.model_config.vocab_size

    def prompts(n):
        return [{"prompt_token_ids": rng.integers(1, vocab, ns.input_len).tolist()}
                for _ in range(n)]

    # Decode steps at a fixed batch (every replica holds a full batch).
    batch = ns.decode_batch * len(replicas)
    decode = SamplingParams(max_tokens=ns.decode_steps, ignore_eos=True,
                            temperature=0)
    llm.generate(prompts(batch), decode, use_tqdm=False)  # compiles
    for r in replicas:
        r.timeline.restart()
    llm.generate(prompts(batch), decode, use_tqdm=False)
    decode_ms = _decode_ms(replicas[0].timeline.records, ns.decode_batch)

    work = SamplingParams(max_tokens=ns.output_len, ignore_eos=True,
                          temperature=1.0)
    llm.generate(prompts(ns.num_prompts), work, use_tqdm=False)  # compiles
    start = time.perf_counter()
    outs = llm.generate(prompts(ns.num_prompts), work, use_tqdm=False)
    elapsed = time.perf_counter() - start
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"layout": name, "kwargs": layout_kwargs(name),
            "devices": [str(d) for d in jax.devices()][:8],
            "device_kind": jax.devices()[0].device_kind,
            "kv_pages_per_replica": engine.runner.num_blocks,
            "tokens": tokens, "decode_batch": ns.decode_batch,
            "decode_step_ms": decode_ms,
            "throughput": {"elapsed_s": elapsed, "output_tokens": n_out,
                           "output_tokens_per_s": n_out / elapsed}}


def summarize(results: dict) -> dict:
    def get(name, *keys):
        node = results.get(name)
        for k in keys:
            node = None if node is None else node.get(k)
        return node

    out: dict = {"tokens_equal_tp1": {
        name: r["tokens"] == results["tp1"]["tokens"]
        for name, r in results.items() if "tp1" in results}}
    rate = {n: get(n, "throughput", "output_tokens_per_s") for n in results}
    step = {n: get(n, "decode_step_ms") for n in results}
    if "tp1" in results and "tp2" in results:
        out["tp2_vs_tp1"] = {"decode_step_ratio": _ratio(step["tp2"], step["tp1"]),
                             "throughput_ratio": _ratio(rate["tp2"], rate["tp1"])}
    if "pp2" in results and "tp2" in results:
        out["pp2_vs_tp2"] = {"decode_step_ratio": _ratio(step["pp2"], step["tp2"]),
                             "throughput_ratio": _ratio(rate["pp2"], rate["tp2"])}
    if "dp2" in results and "tp1" in results:
        out["dp2_vs_2x_tp1"] = {"throughput_ratio": _ratio(
            rate["dp2"], 2 * rate["tp1"] if rate["tp1"] else None)}
    return out


def _ratio(a, b):
    return a / b if a is not None and b else None


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="benchmarks/models/llama3-8b")
    p.add_argument("--load-format", default="dummy", choices=["auto", "dummy"])
    p.add_argument("--tokenizer", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layouts", nargs="+", default=["tp1", "tp2", "pp2", "dp2"])
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--decode-batch", type=int, default=256,
                   help="sequences per replica in the decode-step measurement")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--greedy-tokens", type=int, default=16)
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction,
                   default=False, help="compile every bucket at start")
    p.add_argument("--cpu-devices", type=int, default=0,
                   help="run on this many fake CPU devices (smoke runs)")
    p.add_argument("--out", required=True)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = parse(argv)
    if ns.child:  # one layout, then its result on stdout
        print("RESULT" + json.dumps(measure(ns, ns.child)), flush=True)
        return 0
    import tempfile
    env = dict(os.environ)
    if ns.cpu_devices:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} --xla_force_host_"
                            f"platform_device_count={ns.cpu_devices}").strip()
    results, errors = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ns.layouts:
            layout_kwargs(name)  # a typo fails before anything runs
            argv_child = [a for a in (argv if argv is not None else sys.argv[1:])]
            cmd = [sys.executable, os.path.abspath(__file__), *argv_child,
                   "--child", name, "--tmp", tmp]
            print(f"{name}: running", flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((l for l in proc.stdout.splitlines()
                         if l.startswith("RESULT")), None)
            if proc.returncode != 0 or line is None:
                errors[name] = proc.stderr[-3000:]
                print(f"{name}: failed\n{errors[name]}", flush=True)
                continue
            results[name] = json.loads(line[len("RESULT"):])
            r = results[name]
            print(f"{name}: decode step {r['decode_step_ms']} ms, "
                  f"{r['throughput']['output_tokens_per_s']:.1f} output tok/s",
                  flush=True)
    record = {"args": {k: v for k, v in vars(ns).items()
                       if k not in ("child", "tmp")},
              "results": results, "errors": errors,
              "summary": summarize(results)}
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    with open(ns.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record["summary"], indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
