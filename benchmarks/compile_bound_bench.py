"""Requests shaped to make the server compile, against an ordinary client.

Starts `jaxinfer serve` (warm-up on), then sends ``--num-requests``
requests mixing every sampling field at list widths drawn from 1 to the
vocabulary (log-uniform; a few over the vocabulary, which must be refused
with a 400) while an ordinary client's two-token completion keeps
measuring its latency. The attack pauses between ``--phases`` to measure
the ordinary client alone, so its baseline (those and the requests before
the attack) sees the same machine load. Records the server's compile
counter and program count (`/metrics`) before and after, the server
process tree's memory-map count and RSS with the machine's free memory and
load, the ordinary client's p50/p99 against its baseline, the slowest
requests, and whether the server is still alive. Writes
``compile_bound.json`` under ``--out``.

CPU (the embedded model):

    python benchmarks/compile_bound_bench.py --out /tmp/cb --num-requests 2000

GPU machine, repo root (llama3-8b shape, random weights):

    export PYTHONPATH=$PWD
    python3 benchmarks/compile_bound_bench.py --out $OUT \\
        --model benchmarks/models/llama3-8b --load-format dummy \\
        --tokenizer .tok --dtype bfloat16 --num-requests 2000 --concurrency 32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_stamp import run_stamp
from serving_speed import engine_flags, free_port, jaxinfer, stop_server, wait_healthy

MODEL_NAME = "bench"


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name",
                              "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out.splitlines()[0] if out else "cpu"


def vocab_size(ns) -> int:
    if ns.vocab_size:
        return ns.vocab_size
    from jaxinfer.models.loader import resolve_model
    return resolve_model(ns.model, ns.load_format).config.vocab_size


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the engine core may be a child)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def memory(pid: int) -> dict:
    """Memory-map lines and RSS (MiB) summed over the process tree."""
    maps = rss = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/maps") as f:
                maps += sum(1 for _ in f)
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
        except OSError:
            continue
    return {"t": time.time(), "maps": maps, "rss_mib": rss / 1024,
            **machine()}


def machine() -> dict:
    """The machine's free memory and load: a stall while the whole machine
    is short of memory is the machine's, not the server's."""
    out = {"load1": os.getloadavg()[0]}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    out["mem_available_mib"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def shape(body: dict) -> dict:
    """A request's fields, lists by width (for the slowest requests)."""
    return {k: (len(v) if isinstance(v, (list, dict)) else v)
            for k, v in body.items() if k not in ("model", "prompt")}


def scrape(base: str) -> dict:
    text = requests.get(base + "/metrics", timeout=30).text
    out = {}
    for name in ("jaxinfer:compiles_total", "jaxinfer:compile_seconds_total",
                 "jaxinfer:step_programs", "jaxinfer:step_programs_known"):
        for line in text.splitlines():
            if line.startswith(name + "{"):
                out[name.split(":")[1]] = float(line.rsplit(" ", 1)[1])
    return out


def hostile_body(rng: random.Random, V: int, over: bool) -> dict:
    """A completion request with every sampling field on or off at random,
    list widths log-uniform in [1, V] (V + 1 when ``over``)."""
    def width() -> int:
        return V + 1 if over else min(V, int(2 ** rng.uniform(0, V.bit_length())))

    body: dict = {"model": MODEL_NAME, "max_tokens": rng.randrange(1, 4),
                  "prompt": [rng.randrange(3, V) for _ in range(rng.randrange(1, 40))],
                  "seed": rng.randrange(10_000)}
    if rng.random() < 0.7:
        body["temperature"] = rng.choice([0.5, 1.0])
        body.update(rng.choice([{}, {"top_k": rng.randrange(1, V)},
                                {"top_p": 0.8}, {"min_p": 0.05},
                                {"top_k": 5, "top_p": 0.9, "min_p": 0.1}]))
        if rng.random() < 0.1:
            body["n"] = 2
    else:
        body["temperature"] = 0.0
    if rng.random() < 0.4:
        body["logit_bias"] = {str(t): rng.uniform(-5, 5)
                              for t in rng.sample(range(V), min(width(), V))}
    if over or rng.random() < 0.4:
        n = width()
        body["allowed_token_ids"] = [rng.randrange(V) for _ in range(n)]
    if rng.random() < 0.2:
        body["bad_words"] = [rng.choice(["the", "a b", "hello world"])]
    if rng.random() < 0.2:
        body["min_tokens"] = rng.randrange(1, body["max_tokens"] + 1)
    for field in ("presence_penalty", "frequency_penalty"):
        if rng.random() < 0.2:
            body[field] = rng.uniform(-1, 1)
    if rng.random() < 0.2:
        body["repetition_penalty"] = rng.uniform(0.8, 1.3)
    if rng.random() < 0.3:
        body["logprobs"] = rng.randrange(0, 6)
    if rng.random() < 0.2:
        body["prompt_logprobs"] = rng.randrange(0, 6)
    if rng.random() < 0.2:
        body["stop_token_ids"] = rng.sample(range(V), width() % 40 + 1)
    if rng.random() < 0.1:
        body["stop"] = ["\n", "zz"]
    return body


def ordinary(base: str, timeout: float = 600) -> float:
    """One two-token greedy completion; seconds."""
    t0 = time.perf_counter()
    r = requests.post(base + "/v1/completions", timeout=timeout, json={
        "model": MODEL_NAME, "prompt": "The capital of France is",
        "max_tokens": 2, "temperature": 0})
    r.raise_for_status()
    return time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def attack(ns, base: str, V: int, pid: int) -> dict:
    rng = random.Random(ns.seed)
    bodies = [hostile_body(rng, V, over=rng.random() < ns.over_share)
              for _ in range(ns.num_requests)]
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    samples = [memory(pid)]
    done = threading.Event()
    latencies: list[float] = []
    ended: list[float] = []  # when each ordinary request ended

    failures: list[str] = []

    # The ordinary client's turn: held during each of its requests, and by
    # the main thread while it measures the ordinary client alone between
    # phases of the attack (the same machine load as the attack sees).
    turn = threading.Lock()
    attacking = threading.Event()
    alone: list[float] = []

    def measure():
        while not done.is_set():
            if not attacking.wait(0.1):
                continue
            turn.acquire()
            t0 = time.perf_counter()
            try:
                latencies.append(ordinary(base, ns.ordinary_timeout))
            except requests.RequestException as e:  # counted, at its time
                failures.append(type(e).__name__)
                latencies.append(time.perf_counter() - t0)
            ended.append(time.time())
            turn.release()
            time.sleep(ns.ordinary_interval)

    timed: list[tuple[float, float, int]] = []  # (seconds, started, i)

    def send(i_body):
        i, body = i_body
        t0 = time.perf_counter()
        try:
            code = str(requests.post(base + "/v1/completions", json=body,
                                     timeout=600).status_code)
        except requests.RequestException as e:
            code = type(e).__name__
        with lock:
            timed.append((time.perf_counter() - t0, time.time(), i))
            statuses[code] = statuses.get(code, 0) + 1
            if i % 100 == 99:
                samples.append(memory(pid))

    watcher = threading.Thread(target=measure, daemon=True)
    watcher.start()

    def measure_alone(n: int) -> None:
        with turn:  # the attack is paused and the watcher idle
            alone.extend(ordinary(base) for _ in range(n))

    phases = max(1, ns.phases)
    per_phase = max(1, ns.baseline_requests // phases)
    chunks = [list(enumerate(bodies))[k::phases] for k in range(phases)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(ns.concurrency) as pool:
        for chunk in chunks:
            measure_alone(per_phase)
            attacking.set()
            list(pool.map(send, chunk))
            attacking.clear()
        measure_alone(per_phase)
    seconds = time.perf_counter() - t0
    done.set()
    watcher.join()
    samples.append(memory(pid))
    return {"seconds": seconds, "statuses": statuses,
            "over_vocab_requests": sum(
                len(b.get("allowed_token_ids", ())) > V for b in bodies),
            "memory": samples, "ordinary_s": latencies,
            "ordinary_alone_s": alone,
            "ordinary_slowest": sorted(
                ({"seconds": t, "ended": e} for t, e in zip(latencies, ended)),
                key=lambda x: -x["seconds"])[:5],
            "hostile_p50_s": pct([t for t, _, _ in timed], 0.5),
            "slowest_hostile": [
                {"seconds": t, "ended": e, **shape(bodies[i])}
                for t, e, i in sorted(timed, reverse=True)[:10]],
            "ordinary_failures": failures}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=None,
                   help="default: read from the model's config")
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=1,
                   help="hostile requests in flight at once (1: the attack "
                   "measures compiles, not a saturated batch)")
    p.add_argument("--baseline-requests", type=int, default=40,
                   help="ordinary requests alone before the attack, and as "
                   "many again spread between its phases")
    p.add_argument("--phases", type=int, default=10,
                   help="the attack pauses between phases to measure the "
                   "ordinary client alone under the same machine load")
    p.add_argument("--ordinary-interval", type=float, default=0.2)
    p.add_argument("--ordinary-timeout", type=float, default=120)
    p.add_argument("--over-share", type=float, default=0.01,
                   help="share of requests over the vocabulary (must be 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=3600)
    p.add_argument("--engine", action="append", default=[],
                   help="KEY=VALUE engine flag, repeatable")
    ns = p.parse_args()
    os.makedirs(ns.out, exist_ok=True)
    V = vocab_size(ns)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flags = engine_flags(ns)
    log = open(os.path.join(ns.out, "server.log"), "w")
    t0 = time.perf_counter()
    server = subprocess.Popen(jaxinfer(
        "serve", *flags, "--port", str(port), "--served-model-name",
        MODEL_NAME, "--uvicorn-log-level", "warning"),
        stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(base, server, ns.start_timeout)
        start_s = time.perf_counter() - t0
        after_warmup = scrape(base)
        baseline = [ordinary(base) for _ in range(ns.baseline_requests)]
        before = scrape(base)
        run = attack(ns, base, V, server.pid)
        after = scrape(base)
        alive = server.poll() is None and requests.get(
            base + "/health", timeout=30).status_code == 200
    finally:
        stop_server(server)
        log.close()
    mem0, mem1 = run["memory"][0], run["memory"][-1]
    # The baseline: the ordinary client alone, before the attack and in
    # its pauses (so a machine busy with other work slows both sides).
    alone = run.pop("ordinary_alone_s")
    baseline_all = baseline + alone
    base_p50, base_p99 = pct(baseline_all, 0.5), pct(baseline_all, 0.99)
    during = run.pop("ordinary_s")
    record = {
        **run_stamp(), "device": device_name(),
        "workload": f"{ns.num_requests} requests mixing every sampling field "
                    f"at widths 1..vocab against a warmed-up server "
                    f"({ns.model}), an ordinary client alongside",
        "model": ns.model, "vocab_size": V, "num_requests": ns.num_requests,
        "concurrency": ns.concurrency, "server_start_s": start_s,
        "metrics_after_warmup": after_warmup, "metrics_before": before,
        "metrics_after": after, **run,
        "ordinary": {"baseline_p50_s": base_p50, "baseline_p99_s": base_p99,
                     "baseline_count": len(baseline_all),
                     "before_attack_p50_s": pct(baseline, 0.5),
                     "in_pauses_p50_s": pct(alone, 0.5),
                     "during_p50_s": pct(during, 0.5),
                     "during_p99_s": pct(during, 0.99),
                     "during_max_s": max(during, default=None),
                     "during_count": len(during)},
        "alive": alive,
    }
    p99 = record["ordinary"]["during_p99_s"]
    record["verdicts"] = {
        "no_compile": after.get("compiles_total") == after_warmup.get(
            "compiles_total"),
        "programs_within_set": after.get("step_programs", 0) <= after.get(
            "step_programs_known", 0),
        "maps_flat_10pct": mem1["maps"] <= 1.1 * mem0["maps"],
        "rss_flat_10pct": mem1["rss_mib"] <= 1.1 * mem0["rss_mib"],
        "ordinary_p99_within_2x": (p99 is not None and base_p99 is not None
                                   and p99 <= 2 * base_p99),
        "ordinary_never_failed": not run["ordinary_failures"],
        "over_vocab_refused": run["statuses"].get("400", 0)
        == run["over_vocab_requests"],
        "alive": alive,
    }
    path = os.path.join(ns.out, "compile_bound.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({"verdicts": record["verdicts"],
                      "ordinary": record["ordinary"],
                      "statuses": run["statuses"]}, indent=1))
    return 0 if all(record["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
