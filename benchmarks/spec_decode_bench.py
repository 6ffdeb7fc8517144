"""Speculative decoding (n-gram) against plain decoding, one command:

    export PYTHONPATH=$PWD
    python3 benchmarks/spec_decode_bench.py --out $OUT \\
        --model benchmarks/models/llama3-8b --load-format dummy --tokenizer .tok
    python3 benchmarks/spec_decode_bench.py --tiny --out /tmp/sd   # CPU check

Workload (favours n-gram): greedy requests whose prompts repeat a random
run of tokens, ``--output-len`` tokens each (ignore_eos), at each batch
size of ``--batch-sizes`` (all requests added at once). Each engine runs
in its own child process (two 8B engines do not share one GPU): one with
``speculative_config`` (ngram, ``--num-speculative-tokens``), one
without. Each batch runs twice in its engine and the second run is timed
(the first builds the step programs it lands in; the prefix cache is
emptied between them, so both compute the same steps).

Writes ``spec-decode-bench.json``: per batch size the output tok/s of
both engines, the speedup, and the speculative engine's acceptance rate
and mean accepted length (tokens emitted per drafted row: accepted drafts
+ 1); whether the greedy tokens of both engines agree; and the verdict of
the targets (batch 1 at least TARGETS['batch1_speedup_min'] times plain
decoding, batch 64 no slower). With random weights how often drafts are
accepted depends on how the model repeats itself, so read the speedup
together with the acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

TARGETS = {"batch1_speedup_min": 1.8, "batch64_speedup_min": 1.0}


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Token-id prompts of ``length`` that repeat a random run of 16-64
    tokens (one run per prompt)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        run = [rng.randrange(100, vocab) for _ in range(rng.randrange(16, 65))]
        out.append((run * (length // len(run) + 1))[:length])
    return out


def child(ns) -> dict:
    """One engine (speculative or plain) over every batch size."""
    from jaxinfer import LLM, SamplingParams
    spec = None
    if ns.child == "spec":
        spec = {"method": "ngram",
                "num_speculative_tokens": ns.num_speculative_tokens,
                "prompt_lookup_max": ns.prompt_lookup_max,
                "prompt_lookup_min": ns.prompt_lookup_min}
    kw = dict(model=ns.model, load_format=ns.load_format, dtype=ns.dtype,
              max_model_len=ns.max_model_len,
              max_num_seqs=max(ns.batch_sizes), speculative_config=spec,
              # The untimed first run builds the programs the workload
              # lands in; building every bucket's would only cost time.
              warmup=False)
    if ns.tokenizer:
        kw["tokenizer"] = ns.tokenizer
    for pair in ns.engine:
        key, _, value = pair.partition("=")
        kw[key] = json.loads(value) if value[:1] in "0123456789[{tf" else value
    llm = LLM(**kw)
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    sp = SamplingParams(temperature=0.0, max_tokens=ns.output_len,
                        ignore_eos=True)
    record: dict = {"engine": ns.child, "batches": {}}
    for S in ns.batch_sizes:
        batch = [{"prompt_token_ids": p}
                 for p in prompts(S, ns.prompt_len, vocab, ns.seed + S)]
        llm.generate(batch, sp, use_tqdm=False)  # builds its programs
        # The timed run computes its prompts again (the same buckets).
        engine.reset_prefix_cache()
        before = engine.get_stats().spec_decode
        steps = engine.num_steps
        t0 = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        row = {"seconds": seconds, "output_tokens": tokens,
               "output_tok_s": tokens / seconds,
               "steps": engine.num_steps - steps,
               "token_ids": [list(o.outputs[0].token_ids) for o in outs]}
        after = engine.get_stats().spec_decode
        if after is not None and before is not None:
            drafts = after.num_drafts - before.num_drafts
            draft_tokens = after.num_draft_tokens - before.num_draft_tokens
            accepted = after.num_accepted_tokens - before.num_accepted_tokens
            row.update(
                num_drafts=drafts, num_draft_tokens=draft_tokens,
                num_accepted_tokens=accepted,
                acceptance_rate=accepted / max(1, draft_tokens),
                mean_accepted_length=1 + accepted / max(1, drafts),
                accepted_per_pos=[a - b for a, b in zip(
                    after.accepted_per_pos, before.accepted_per_pos)])
        record["batches"][str(S)] = row
    return record


def run_child(ns, which: str) -> dict:
    path = os.path.join(ns.out, f"{which}.part.json")
    argv = [sys.executable, os.path.abspath(__file__), "--child", which,
            "--out", ns.out]
    for key in ("model", "load_format", "tokenizer", "dtype", "max_model_len",
                "output_len", "prompt_len", "seed", "num_speculative_tokens",
                "prompt_lookup_max", "prompt_lookup_min"):
        value = getattr(ns, key)
        if value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    argv += ["--batch-sizes", ",".join(map(str, ns.batch_sizes))]
    for pair in ns.engine:
        argv += ["--engine", pair]
    subprocess.run(argv, check=True)
    with open(path) as f:
        return json.load(f)


def summarize(ns, base: dict, spec: dict) -> dict:
    import jax

    from benchmarks.run_stamp import run_stamp
    rows = {}
    for S in map(str, ns.batch_sizes):
        b, s = base["batches"][S], spec["batches"][S]
        rows[S] = {
            "plain_output_tok_s": b["output_tok_s"],
            "spec_output_tok_s": s["output_tok_s"],
            "speedup": s["output_tok_s"] / b["output_tok_s"],
            "plain_steps": b["steps"], "spec_steps": s["steps"],
            "same_tokens": b["token_ids"] == s["token_ids"],
            **{k: s[k] for k in ("acceptance_rate", "mean_accepted_length",
                                 "num_drafts", "num_draft_tokens",
                                 "num_accepted_tokens", "accepted_per_pos")
               if k in s}}
    verdicts = {}
    if "1" in rows:
        verdicts["batch1_speedup"] = (
            rows["1"]["speedup"] >= TARGETS["batch1_speedup_min"])
    if "64" in rows:
        verdicts["batch64_no_slower"] = (
            rows["64"]["speedup"] >= TARGETS["batch64_speedup_min"])
    return {"model": ns.model, "load_format": ns.load_format,
            "dtype": ns.dtype, "device": str(jax.devices()[0].device_kind),
            "workload": {"prompt_len": ns.prompt_len,
                         "output_len": ns.output_len,
                         "batch_sizes": ns.batch_sizes, "greedy": True},
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": ns.num_speculative_tokens,
                "prompt_lookup_max": ns.prompt_lookup_max,
                "prompt_lookup_min": ns.prompt_lookup_min},
            "targets": TARGETS, "verdicts": verdicts, "batches": rows,
            **run_stamp()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true",
                   help="CPU check: the embedded model, small sizes")
    p.add_argument("--model", default="benchmarks/models/llama3-8b")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--batch-sizes", default="1,64",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", action="append", default=[],
                   metavar="KEY=VALUE", help="more engine arguments")
    p.add_argument("--child", choices=("spec", "plain"), help=argparse.SUPPRESS)
    ns = p.parse_args()
    os.makedirs(ns.out, exist_ok=True)
    if ns.tiny:
        ns.model, ns.load_format, ns.tokenizer = "smollm2-135m-instruct", "auto", None
        ns.dtype, ns.max_model_len = "float32", 256
        ns.prompt_len, ns.output_len, ns.batch_sizes = 64, 24, [1, 4]
    if ns.child:
        record = child(ns)
        with open(os.path.join(ns.out, f"{ns.child}.part.json"), "w") as f:
            json.dump(record, f)
        return 0
    result = summarize(ns, run_child(ns, "plain"), run_child(ns, "spec"))
    path = os.path.join(ns.out, "spec-decode-bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("verdicts", "batches")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
