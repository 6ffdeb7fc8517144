"""`jaxinfer bench serving`: a load generator against a running server.

    jaxinfer serve M --port 8000 &
    jaxinfer bench serving --base-url http://127.0.0.1:8000 --model M \\
        --num-prompts 500 --request-rate 4 --dataset sharegpt-synthetic

Requests are streaming `/v1/completions` calls through the official `openai`
client, with random token-id prompts and outputs forced to their length
(`ignore_eos`), sent with Poisson arrivals at ``--request-rate`` per second
(``inf``: all at once). Reports vLLM's serving metrics: TTFT, TPOT (time per
output token after the first), ITL (gaps between streamed chunks) and
end-to-end latency (mean, median, p99), request and token throughput.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import numpy as np

from .bench import random_token_prompts, synthetic_lengths


@dataclasses.dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0  # seconds to the first streamed token
    e2el: float = 0.0  # seconds to the end of the stream
    itl: list[float] = dataclasses.field(default_factory=list)
    error: str = ""


async def _one(client, model: str, prompt: list[int], max_tokens: int) -> RequestResult:
    start = time.perf_counter()
    res = RequestResult(ok=False, prompt_len=len(prompt))
    last = None
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
            temperature=1.0, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if last is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
            if chunk.usage is not None:
                res.output_tokens = chunk.usage.completion_tokens
        res.e2el = time.perf_counter() - start
        res.ok = last is not None
    except Exception as e:  # a failed request is counted, not fatal
        res.error = f"{type(e).__name__}: {e}"
    return res


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean_ms": None, "median_ms": None, "p99_ms": None}
    ms = np.asarray(values) * 1e3
    return {"mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)),
            "p99_ms": float(np.percentile(ms, 99))}


async def run_load(base_url: str, model: str, lengths, request_rate: float,
                   api_key: str | None = None, seed: int = 0,
                   input_vocab: int = 1000) -> dict:
    """Sends one request per (prompt_len, output_len) and summarizes."""
    try:
        from openai import AsyncOpenAI
    except ImportError as e:  # an optional dependency: say how to get it
        raise ValueError("jaxinfer bench serving needs the openai client: "
                         "pip install 'jaxinfer[bench]'") from e
    rng = np.random.default_rng(seed)
    prompts = random_token_prompts(lengths, input_vocab, rng)
    client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1",
                         api_key=api_key or "unused", max_retries=0,
                         timeout=3600)
    tasks = []
    start = time.perf_counter()
    async with client:
        for prompt, (_, out_len) in zip(prompts, lengths):
            tasks.append(asyncio.create_task(_one(client, model, prompt, out_len)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / request_rate))
        results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.output_tokens > 1]
    return {
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration, "request_rate": request_rate,
        "total_input_tokens": sum(r.prompt_len for r in ok),
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "ttft": _stats([r.ttft for r in ok]),
        "tpot": _stats(tpot),
        "itl": _stats([x for r in ok for x in r.itl]),
        "e2el": _stats([r.e2el for r in ok]),
        "per_request": [dataclasses.asdict(r) for r in results],
    }


def run_serving(ns) -> int:
    rng = np.random.default_rng(ns.data_seed)
    lengths = synthetic_lengths(ns.dataset, ns.num_prompts, ns.input_len,
                                ns.output_len, ns.max_model_len, rng)
    rate = float(ns.request_rate)
    record = asyncio.run(run_load(ns.base_url, ns.model, lengths, rate,
                                  ns.api_key, ns.data_seed))
    record["args"] = {k: v for k, v in vars(ns).items() if k != "func"}
    if ns.output_json:
        with open(ns.output_json, "w") as f:
            json.dump(record, f, indent=1)
    t = record["ttft"]
    print(f"{record['completed']} completed, {record['failed']} failed in "
          f"{record['duration_s']:.2f} s: {record['request_throughput']:.2f} "
          f"req/s, {record['output_throughput']:.1f} output tok/s; TTFT "
          f"median {t['median_ms'] or 0:.1f} ms p99 {t['p99_ms'] or 0:.1f} ms; "
          f"TPOT median {record['tpot']['median_ms'] or 0:.1f} ms")
    return 0 if record["failed"] == 0 else 1


def add_serving_parser(kinds) -> None:
    p = kinds.add_parser("serving", help="load a running server (TTFT, TPOT, ITL)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", default="inf",
                   help="requests per second (Poisson arrivals), or inf")
    p.add_argument("--dataset", default="fixed",
                   choices=["fixed", "sharegpt-synthetic"])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048,
                   help="the server's context, to keep synthetic lengths inside it")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=run_serving)

