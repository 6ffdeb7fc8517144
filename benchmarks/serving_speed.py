"""Offline against online on the same prompts, in one process tree: `jaxinfer
bench throughput` (offline, `LLM.generate`), then `jaxinfer serve` loaded by
`jaxinfer bench serving` at ``--request-rate inf`` and at 16 requests/s,
each phase with the engine's step timeline. GPU machine, repo root:

    export PYTHONPATH=$PWD
    python3 benchmarks/serving_speed.py --out $OUT \\
        [--model benchmarks/models/llama3-8b --load-format dummy] \\
        [--num-prompts 1000 --rate16-prompts 800] [--engine KEY=VALUE ...]

CPU check (the embedded model, a few prompts):

    python3 benchmarks/serving_speed.py --out /tmp/ss --model smollm2-135m-instruct \\
        --load-format auto --dtype float32 --max-model-len 512 --num-prompts 20 \\
        --rate16-prompts 20

Writes ``summary.json`` (each phase's bench record, the online/offline
ratio, the device-busy share of each online phase from its timeline and
each target's verdict) and ``offline.steps.jsonl``, ``online-inf.steps.jsonl``,
``online-16.steps.jsonl``. Each online phase gets its own server start (the
second is warm: the persistent compilation cache), so each timeline holds
one phase. Prompts: sharegpt-synthetic lengths and random token ids from
the same seed in every phase.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

TARGETS = {  # the targets on one H200 (llama3-8b shape, bf16)
    "offline_output_tok_s_min": 15000,
    "online_over_offline_min": 0.90,
    "online_device_busy_min": 0.95,
    "rate16_ttft_p50_ms_max": 50, "rate16_ttft_p99_ms_max": 150,
    "rate16_tpot_p50_ms_max": 10, "rate16_itl_p99_over_tpot_p50_max": 3,
}


def engine_flags(ns) -> list[str]:
    flags = ["--model", ns.model, "--load-format", ns.load_format,
             "--dtype", ns.dtype, "--max-model-len", str(ns.max_model_len)]
    if ns.tokenizer:
        flags += ["--tokenizer", ns.tokenizer]
    for pair in ns.engine:
        key, _, value = pair.partition("=")
        flags += ["--" + key.replace("_", "-"), value]
    return flags


def jaxinfer(*args: str) -> list[str]:
    return [sys.executable, "-m", "jaxinfer", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline(ns, out: str) -> dict:
    path = os.path.join(out, "offline.json")
    subprocess.run(jaxinfer(
        "bench", "throughput", *engine_flags(ns), "--dataset",
        "sharegpt-synthetic", "--num-prompts", str(ns.num_prompts),
        "--data-seed", str(ns.seed), "--profile-steps",
        os.path.join(out, "offline.steps.jsonl"), "--output-json", path),
        check=True)
    with open(path) as f:
        return json.load(f)


def online(ns, out: str, name: str, rate: str, num_prompts: int) -> dict:
    """One server start, loaded once; its bench record."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(out, f"{name}.server.log"), "w")
    server = subprocess.Popen(jaxinfer(
        "serve", *engine_flags(ns), "--port", str(port),
        "--served-model-name", "bench", "--uvicorn-log-level", "warning",
        "--profile-steps", os.path.join(out, f"{name}.steps.jsonl"),
        *(["--api-server-count", str(ns.api_server_count)]
          if ns.api_server_count else [])), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(base, server, ns.start_timeout)
        path = os.path.join(out, f"{name}.json")
        subprocess.run(jaxinfer(
            "bench", "serving", "--base-url", base, "--model", "bench",
            "--dataset", "sharegpt-synthetic", "--num-prompts", str(num_prompts),
            "--request-rate", rate, "--max-model-len", str(ns.max_model_len),
            "--input-vocab", str(ns.input_vocab), "--data-seed", str(ns.seed),
            *(["--num-clients", str(ns.num_clients)] if ns.num_clients else []),
            "--output-json", path), check=False)
        with open(path) as f:
            record = json.load(f)
        record.pop("per_request", None)
        return record
    finally:
        stop_server(server)
        log.close()


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM (the server's graceful stop), SIGKILL after 120 s."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(120)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(30)


def wait_healthy(base: str, server, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the server was not healthy within {timeout} s")


def device_busy(path: str) -> dict:
    """From a step timeline: device time over the span from the first
    step's start to the last step's end."""
    with open(path) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    if not steps:
        return {"steps": 0, "device_busy": None}
    span = (steps[-1]["t_start_s"] - steps[0]["t_start_s"]
            + 1e-3 * (steps[-1]["host_ms"] + steps[-1]["device_ms"]))
    device = 1e-3 * sum(s["device_ms"] for s in steps)
    return {"steps": len(steps), "span_s": span, "device_s": device,
            "compile_s": 1e-3 * sum(s["compile_ms"] for s in steps),
            "device_busy": device / span if span > 0 else None}


def verdicts(summary: dict) -> dict:
    off = summary["offline"]["output_tokens_per_s"]
    inf, r16 = summary["online_inf"], summary["online_16"]
    tpot = r16["tpot"]["median_ms"] or float("nan")
    ratio = inf["output_throughput"] / off
    t = TARGETS
    return {
        "offline_output_tok_s": (off, off >= t["offline_output_tok_s_min"]),
        "online_over_offline": (ratio, ratio >= t["online_over_offline_min"]),
        "online_device_busy": (summary["timelines"]["online-inf"]["device_busy"],
                               (summary["timelines"]["online-inf"]["device_busy"]
                                or 0) >= t["online_device_busy_min"]),
        "rate16_ttft_p50_ms": (r16["ttft"]["median_ms"],
                               (r16["ttft"]["median_ms"] or 1e9)
                               <= t["rate16_ttft_p50_ms_max"]),
        "rate16_ttft_p99_ms": (r16["ttft"]["p99_ms"], (r16["ttft"]["p99_ms"] or 1e9)
                               <= t["rate16_ttft_p99_ms_max"]),
        "rate16_tpot_p50_ms": (tpot, tpot <= t["rate16_tpot_p50_ms_max"]),
        "rate16_itl_p99_over_tpot_p50": (
            (r16["itl"]["p99_ms"] or 1e9) / tpot,
            (r16["itl"]["p99_ms"] or 1e9) / tpot
            <= t["rate16_itl_p99_over_tpot_p50_max"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="benchmarks/models/llama3-8b")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--rate16-prompts", type=int, default=800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--input-vocab", type=int, default=None,
                    help="the model's vocabulary size (default: read from "
                    "its config.json), so that every phase draws the same "
                    "prompt token ids")
    ap.add_argument("--api-server-count", type=int, default=None)
    ap.add_argument("--num-clients", type=int, default=None)
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine flag for every phase (max_num_seqs=1024)")
    ns = ap.parse_args()
    if ns.input_vocab is None:
        config = os.path.join(ns.model, "config.json")
        if not os.path.exists(config):
            ap.error(f"{ns.model} has no config.json: give --input-vocab "
                     "(the model's vocabulary size)")
        with open(config) as f:
            ns.input_vocab = json.load(f)["vocab_size"]
    os.makedirs(ns.out, exist_ok=True)
    summary: dict = {"args": vars(ns), "targets": TARGETS}
    summary["offline"] = offline(ns, ns.out)
    summary["online_inf"] = online(ns, ns.out, "online-inf", "inf", ns.num_prompts)
    summary["online_16"] = online(ns, ns.out, "online-16", "16", ns.rate16_prompts)
    summary["timelines"] = {name: device_busy(os.path.join(ns.out, f"{name}.steps.jsonl"))
                            for name in ("offline", "online-inf", "online-16")}
    summary["verdicts"] = verdicts(summary)
    with open(os.path.join(ns.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for name, (value, ok) in summary["verdicts"].items():
        print(f"{name:32s} {value if value is None else round(value, 3)!s:>12} "
              f"{'ok' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
