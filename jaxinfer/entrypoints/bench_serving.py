"""`jaxinfer bench serving`: a load generator against a running server.

    jaxinfer serve M --port 8000 &
    jaxinfer bench serving --base-url http://127.0.0.1:8000 --model M \\
        --num-prompts 500 --request-rate 4 --dataset sharegpt-synthetic

Requests are streaming `/v1/completions` calls with random token-id prompts
and outputs forced to their length (`ignore_eos`), sent with Poisson
arrivals at ``--request-rate`` per second (``inf``: all at once). The
schedule is drawn once and dealt round-robin to ``--num-clients`` client
processes, each an asyncio loop over aiohttp (one connection per request
in flight; vLLM's load generator is built the same way), so the generator
is not the bottleneck; each process reports its CPU time, and the record
says how busy the busiest was.

A request counts as completed when the server finished it: a chunk with
its ``finish_reason`` (its token count from the usage chunk), whatever its
text (tokens that decode to an incomplete UTF-8 character stream no text).
Reports vLLM's serving metrics: TTFT, TPOT (time per output token after
the first), ITL (gaps between streamed chunks) and end-to-end latency
(mean, median, p99), request and token throughput.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import time

import numpy as np

from .bench import random_token_prompts, synthetic_lengths

# A client process busier than this (CPU time / wall time) may itself be
# what limits the measured rate.
BUSY_WARNING = 0.8


@dataclasses.dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0  # seconds to the first streamed token
    e2el: float = 0.0  # seconds to the end of the stream
    itl: list[float] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    error: str = ""


class StreamReader:
    """Turns one streamed completion's SSE payloads into its result."""

    def __init__(self, result: RequestResult, start: float):
        self.result, self.start = result, start
        self.last: float | None = None
        self.chunks = 0  # chunks that carried a token

    def feed(self, payload: str, now: float) -> bool:
        """One ``data:`` payload; returns False at ``[DONE]``."""
        res = self.result
        if payload == "[DONE]":
            return False
        event = json.loads(payload)
        if "error" in event:
            err = event["error"]
            res.error = f"HTTP {err.get('code')}: {err.get('message')}"
            return True
        choices = event.get("choices") or []
        if choices:  # the server sends a chunk per step with tokens
            if self.last is None:
                res.ttft = now - self.start
            else:
                res.itl.append(now - self.last)
            self.last = now
            self.chunks += 1
            if choices[0].get("finish_reason") is not None:
                res.finish_reason = choices[0]["finish_reason"]
        if event.get("usage"):
            res.output_tokens = event["usage"]["completion_tokens"]
        return True

    def finish(self, now: float) -> RequestResult:
        res = self.result
        res.e2el = now - self.start
        res.ok = res.finish_reason is not None and not res.error
        if res.ok and not res.output_tokens:
            res.output_tokens = self.chunks
        return res


async def _one(session, url: str, headers: dict, model: str, prompt: list[int],
               max_tokens: int) -> RequestResult:
    res = RequestResult(ok=False, prompt_len=len(prompt))
    start = time.perf_counter()
    reader = StreamReader(res, start)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "stream": True, "temperature": 1.0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                text = await resp.text()
                res.error = f"HTTP {resp.status}: {text[:200]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if line.startswith(b"data: ") and not reader.feed(
                        line[6:].decode(), time.perf_counter()):
                    break
        return reader.finish(time.perf_counter())
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        res.error = f"{type(e).__name__}: {e}"
        return res


async def _client(base_url: str, model: str, api_key: str | None,
                  schedule: list, start_at: float) -> list[RequestResult]:
    """One client process's share: (send offset, prompt, max_tokens)."""
    import aiohttp
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
    connector = aiohttp.TCPConnector(limit=0)  # a connection per request
    tasks = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as s:
        for offset, prompt, max_tokens in schedule:
            delay = start_at + offset - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                _one(s, url, headers, model, prompt, max_tokens)))
        return list(await asyncio.gather(*tasks))


def _client_process(base_url, model, api_key, schedule, start_at) -> dict:
    cpu0, wall0 = time.process_time(), time.time()
    results = asyncio.run(_client(base_url, model, api_key, schedule, start_at))
    return {"results": [dataclasses.asdict(r) for r in results],
            "cpu_s": time.process_time() - cpu0,
            "wall_s": time.time() - wall0}


def default_num_clients() -> int:
    """One client process per eight CPU cores, one to four (the server
    being measured needs the rest)."""
    return max(1, min(4, (os.cpu_count() or 1) // 8))


def run_load(base_url: str, model: str, lengths, prompts: list[list[int]],
             request_rate: float, api_key: str | None = None, seed: int = 0,
             num_clients: int = 1) -> dict:
    """Sends one request per prompt (its output length from ``lengths``)
    and summarizes."""
    try:
        import aiohttp  # noqa: F401 - only whether it imports
    except ImportError as e:  # an optional dependency: say how to get it
        raise ValueError("jaxinfer bench serving needs aiohttp: "
                         "pip install 'jaxinfer[bench]'") from e
    if num_clients < 1:
        raise ValueError(f"--num-clients must be >= 1, got {num_clients}")
    rng = np.random.default_rng(seed)
    offsets = np.zeros(len(prompts)) if request_rate == float("inf") else \
        np.cumsum(rng.exponential(1.0 / request_rate, len(prompts)))
    shares: list[list] = [[] for _ in range(num_clients)]
    for i, (offset, prompt, (_, out_len)) in enumerate(
            zip(offsets.tolist(), prompts, lengths)):
        shares[i % num_clients].append((offset, prompt, out_len))
    # The processes start together: time to import and connect first.
    start_at = time.time() + 1.0 + 0.5 * num_clients
    if num_clients == 1:
        reports = [_client_process(base_url, model, api_key, shares[0], start_at)]
    else:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(num_clients,
                                                    mp_context=ctx) as pool:
            reports = list(pool.map(
                _client_process, *zip(*[(base_url, model, api_key, share,
                                         start_at) for share in shares])))
    duration = time.time() - start_at
    results = [RequestResult(**r) for rep in reports for r in rep["results"]]
    return summarize(results, duration, request_rate, reports)


def summarize(results: list[RequestResult], duration: float,
              request_rate: float, reports: list[dict]) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.output_tokens > 1]
    busy = max(rep["cpu_s"] / max(rep["wall_s"], 1e-9) for rep in reports)
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
        "client": {"processes": len(reports),
                   "cpu_s": sum(rep["cpu_s"] for rep in reports),
                   "busiest_process_busy": busy},
        "per_request": [dataclasses.asdict(r) for r in results],
    }


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean_ms": None, "median_ms": None, "p99_ms": None}
    ms = np.asarray(values) * 1e3
    return {"mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)),
            "p99_ms": float(np.percentile(ms, 99))}


def run_serving(ns) -> int:
    rng = np.random.default_rng(ns.data_seed)
    lengths = synthetic_lengths(ns.dataset, ns.num_prompts, ns.input_len,
                                ns.output_len, ns.max_model_len, rng)
    # Drawn as `bench throughput` draws them: the same seed and vocabulary
    # give the same prompts.
    prompts = random_token_prompts(lengths, ns.input_vocab, rng)
    record = run_load(ns.base_url, ns.model, lengths, prompts,
                      float(ns.request_rate), ns.api_key, ns.data_seed,
                      num_clients=ns.num_clients or default_num_clients())
    record["args"] = {k: v for k, v in vars(ns).items() if k != "func"}
    if ns.output_json:
        with open(ns.output_json, "w") as f:
            json.dump(record, f, indent=1)
    t, c = record["ttft"], record["client"]
    print(f"{record['completed']} completed, {record['failed']} failed in "
          f"{record['duration_s']:.2f} s: {record['request_throughput']:.2f} "
          f"req/s, {record['output_throughput']:.1f} output tok/s; TTFT "
          f"median {t['median_ms'] or 0:.1f} ms p99 {t['p99_ms'] or 0:.1f} ms; "
          f"TPOT median {record['tpot']['median_ms'] or 0:.1f} ms; client: "
          f"{c['processes']} process(es), {c['cpu_s']:.1f} CPU s, busiest "
          f"{100 * c['busiest_process_busy']:.0f}% busy")
    if c["busiest_process_busy"] > BUSY_WARNING:
        print("the load generator was nearly saturated: raise --num-clients")
    return 0 if record["failed"] == 0 else 1


def add_serving_parser(kinds) -> None:
    p = kinds.add_parser("serving", help="load a running server (TTFT, TPOT, ITL)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", default="inf",
                   help="requests per second (Poisson arrivals), or inf")
    p.add_argument("--num-clients", type=int, default=None,
                   help="client processes sharing the load (default: one "
                   "per eight CPU cores, 1 to 4)")
    p.add_argument("--dataset", default="fixed",
                   choices=["fixed", "sharegpt-synthetic"])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048,
                   help="the server's context, to keep synthetic lengths inside it")
    p.add_argument("--input-vocab", type=int, default=1000,
                   help="prompt token ids are drawn from [100, this); the "
                   "model's vocabulary size gives `bench throughput`'s prompts")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=run_serving)
