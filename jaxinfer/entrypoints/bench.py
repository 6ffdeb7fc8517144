"""`jaxinfer bench {throughput,latency}`: vLLM's offline benchmarks
(`serving`, the online one, is in bench_serving.py).

    jaxinfer bench throughput --model M --input-len 1000 --output-len 1000 --num-prompts 1000
    jaxinfer bench throughput --model M --dataset sharegpt-synthetic --num-prompts 1000
    jaxinfer bench latency --model M --input-len 512 --output-len 128 --batch-size 64

Prompts are random token ids (seeded) and outputs run to their length
(``ignore_eos``), so random weights (``--load-format dummy``) time like real
ones. ``sharegpt-synthetic`` draws lengths with ShareGPT's means (~215 in /
~200 out) and a long tail, without the dataset (nothing is downloaded).
Compilation stays out of the numbers: the engine warms up every shape bucket
once untimed first (``--warmup dry-run``, the default; ``--warmup buckets``
compiles every shape bucket instead). ``--output-json`` writes the parameters,
every repeat and the results.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import time

import numpy as np

from .heap import startup_heap_frozen

# ShareGPT's mean prompt / output lengths in tokens (Llama tokenizer), as in
# vLLM's benchmarks; lognormal lengths with these means and sigma 1.
SHAREGPT_MEANS = (215, 200)


def synthetic_lengths(dataset: str, n: int, input_len: int, output_len: int,
                      max_model_len: int, rng) -> list[tuple[int, int]]:
    if dataset == "fixed":
        return [(input_len, output_len)] * n
    sigma = 1.0
    mu_in, mu_out = (np.log(m) - sigma**2 / 2 for m in SHAREGPT_MEANS)
    ins = np.clip(rng.lognormal(mu_in, sigma, n).astype(int), 4, 1024)
    outs = np.clip(rng.lognormal(mu_out, sigma, n).astype(int), 4, 1024)
    # vLLM's ShareGPT filter: prompt + output within the context.
    outs = np.minimum(outs, max_model_len - ins)
    return list(zip(ins.tolist(), outs.tolist()))


def random_token_prompts(lengths, vocab: int, rng) -> list[list[int]]:
    """One random token-id prompt per (prompt_len, output_len); the lowest
    ids are skipped, since tokenizers keep their special tokens there."""
    return [rng.integers(100, vocab, n).tolist() for n, _ in lengths]


def _prompts(lengths, vocab: int, rng):
    return [{"prompt_token_ids": ids}
            for ids in random_token_prompts(lengths, vocab, rng)]


def _llm(ns):
    from ..entrypoints.cli import engine_args_from
    from ..entrypoints.llm import LLM
    args = dataclasses.replace(engine_args_from(ns),
                               warmup=ns.warmup == "buckets",
                               profile_steps=ns.profile_steps)
    return LLM.from_engine_args(args)


def _params(output_len: int, detokenize: bool):
    from ..sampling_params import SamplingParams
    return SamplingParams(temperature=1.0, top_p=1.0, max_tokens=output_len,
                          ignore_eos=True, detokenize=detokenize)


def _record(ns, kind: str, llm, results: dict) -> dict:
    import jax
    engine = llm.llm_engine
    return {
        "workload": kind, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": jax.devices()[0].device_kind, "num_devices": jax.device_count(),
        "jax": jax.__version__, "args": {k: v for k, v in vars(ns).items()
                                          if k != "func"},
        "max_model_len": engine.max_model_len,
        "num_kv_pages": engine.runner.num_blocks,
        "warmup_programs": engine.warmup_programs,
        "warmup_seconds": engine.warmup_seconds, **results}


def _maybe_trace(trace_dir: str | None):
    """A JAX profiler trace of the block (TensorBoard / Perfetto), or
    nothing."""
    import contextlib
    if not trace_dir:
        return contextlib.nullcontext()
    import jax
    return jax.profiler.trace(trace_dir)


def _write(ns, record: dict) -> None:
    if ns.output_json:
        with open(ns.output_json, "w") as f:
            json.dump(record, f, indent=1)


def run_throughput(ns) -> int:
    llm = _llm(ns)
    rng = np.random.default_rng(ns.data_seed)
    lengths = synthetic_lengths(ns.dataset, ns.num_prompts, ns.input_len,
                                ns.output_len, llm.llm_engine.max_model_len, rng)
    prompts = _prompts(lengths, llm.llm_engine.model_config.vocab_size, rng)
    params = [_params(o, not ns.disable_detokenize) for _, o in lengths]
    if ns.warmup == "dry-run":  # the same workload once: the same buckets compile
        llm.generate(_prompts(lengths, llm.llm_engine.model_config.vocab_size,
                              rng), params, use_tqdm=False)
    runner = llm.llm_engine.runner
    runner.device_seconds = 0.0
    if llm.llm_engine.timeline is not None:
        llm.llm_engine.timeline.restart()
    with startup_heap_frozen() as frozen, _maybe_trace(ns.profile_trace):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
    n_in = sum(len(o.prompt_token_ids) for o in outs)
    n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
    record = _record(ns, "throughput", llm, {
        # The `idle` workload of docs/benchmarking.md: the rest of the wall
        # time is host work the device waited for (scheduling, packing,
        # outputs).
        "device_busy_fraction": runner.device_seconds / elapsed,
        "elapsed_s": elapsed, "num_requests": len(outs),
        "prompt_tokens": n_in, "output_tokens": n_out,
        "requests_per_s": len(outs) / elapsed,
        "output_tokens_per_s": n_out / elapsed,
        "total_tokens_per_s": (n_in + n_out) / elapsed,
        "gc_frozen_objects": frozen})
    _write(ns, record)
    print(f"Throughput: {record['requests_per_s']:.2f} requests/s, "
          f"{record['total_tokens_per_s']:.1f} total tokens/s, "
          f"{record['output_tokens_per_s']:.1f} output tokens/s "
          f"({len(outs)} requests, {n_in} prompt + {n_out} output tokens in "
          f"{elapsed:.2f} s); device busy {100 * record['device_busy_fraction']:.0f}%"
          " of the time")
    return 0


def run_latency(ns) -> int:
    llm = _llm(ns)
    rng = np.random.default_rng(ns.data_seed)
    vocab = llm.llm_engine.model_config.vocab_size
    params = _params(ns.output_len, not ns.disable_detokenize)

    def one_batch() -> float:
        prompts = _prompts([(ns.input_len, ns.output_len)] * ns.batch_size,
                           vocab, rng)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    for _ in range(ns.num_iters_warmup):
        one_batch()
    if llm.llm_engine.timeline is not None:
        llm.llm_engine.timeline.restart()
    with startup_heap_frozen() as frozen, _maybe_trace(ns.profile_trace):
        times = [one_batch() for _ in range(ns.num_iters)]
    record = _record(ns, "latency", llm, {
        "latencies_s": times, "median_s": statistics.median(times),
        "p90_s": float(np.percentile(times, 90)),
        "gc_frozen_objects": frozen})
    _write(ns, record)
    print(f"Latency of a batch of {ns.batch_size} ({ns.input_len} in, "
          f"{ns.output_len} out): median {record['median_s'] * 1e3:.1f} ms, "
          f"p90 {record['p90_s'] * 1e3:.1f} ms over {ns.num_iters} runs")
    return 0


def add_bench_parser(sub) -> None:
    from .cli import add_engine_args
    bench = sub.add_parser("bench", help="offline throughput / latency benchmarks")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    from .bench_serving import add_serving_parser
    add_serving_parser(kinds)
    for name, func, help_ in (("throughput", run_throughput, "requests run to completion"),
                              ("latency", run_latency, "one batch, end to end")):
        p = kinds.add_parser(name, help=help_)
        add_engine_args(p, skip=("warmup", "profile_steps"))
        p.add_argument("--input-len", type=int, default=128)
        p.add_argument("--output-len", type=int, default=128)
        p.add_argument("--disable-detokenize", action="store_true")
        # dry-run by default: compiling every bucket takes longer than the
        # workload on CPU, and the workload compiles only what it uses.
        p.add_argument("--warmup", default="dry-run",
                       choices=["buckets", "dry-run", "none"],
                       help="dry-run (default): run the workload once untimed "
                       "(compiles only the buckets it uses); buckets: compile "
                       "every shape bucket at start; none: timings include "
                       "compiles")
        p.add_argument("--data-seed", type=int, default=0)
        p.add_argument("--profile-steps", default=None, metavar="FILE",
                       help="write the step timeline (one JSON line per "
                       "step; benchmarks/timeline_report.py reads it)")
        p.add_argument("--profile-trace", default=None, metavar="DIR",
                       help="write a JAX profiler trace of the timed part")
        p.add_argument("--output-json", default=None)
        if name == "throughput":
            p.add_argument("--num-prompts", type=int, default=100)
            p.add_argument("--dataset", default="fixed",
                           choices=["fixed", "sharegpt-synthetic"])
        else:
            p.add_argument("--batch-size", type=int, default=8)
            p.add_argument("--num-iters", type=int, default=5)
            p.add_argument("--num-iters-warmup", type=int, default=1)
        p.set_defaults(func=func)
