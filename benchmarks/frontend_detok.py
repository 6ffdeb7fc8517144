"""The engine-core process's host time per step with and without the
text: 64 streaming requests through an `EngineCore` (the core process's
engine half) on the embedded model, on CPU.

    export PYTHONPATH=$PWD
    python benchmarks/frontend_detok.py [--out benchmarks/results/frontend-detok-cpu.json]

Two runs of the same requests (greedy, EOS ignored, DELTA outputs, one
stop string that never matches, so every token is checked):
- ``core_detokenizes``: the params as the client sent them, so the core's
  engine detokenizes, checks the stop string and sends text;
- ``front_end_detokenizes``: the params `FrontendText.add` sends the core
  (token ids only); the front end's text work is timed apart.

Per step it records the core's host tail (from the runner handing back the
step's tokens to the step's messages being encoded: scheduler update,
output processing, the msgpack encoding) and the whole step's wall time;
the medians over the decode steps are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_stamp import run_stamp

CLIENTS, OUTPUT_LEN = 64, 48
FRONT = b"front-0"


def _run(engine, own_text: bool) -> dict:
    from jaxinfer import SamplingParams
    from jaxinfer.engine.core import EngineCore
    from jaxinfer.engine.core_messages import AddRequest, Codec, CoreOutputs
    from jaxinfer.engine.frontend_text import FrontendText
    from jaxinfer.metrics import EngineMetrics
    from jaxinfer.sampling_params import RequestOutputKind

    core = EngineCore(engine, max_num_waiting=None, metrics=EngineMetrics())
    codec, text = Codec(), FrontendText(engine.tokenizer)
    collected: list[float] = []
    real_collect = engine.runner.collect

    def collect(*args, **kwargs):
        out = real_collect(*args, **kwargs)
        collected.append(time.perf_counter())
        return out
    engine.runner.collect = collect
    for i in range(CLIENTS):
        params = SamplingParams(temperature=0, max_tokens=OUTPUT_LEN,
                                ignore_eos=True, stop=["\n\n\n\n\n"],
                                output_kind=RequestOutputKind.DELTA)
        processed = engine.input_processor.process(
            f"Client {i} asks: tell me a story about the number {i}.", params)
        rid = f"r{i}"
        sent = (text.add(rid, processed, processed.params) if own_text
                else processed.params)
        core.add(FRONT, AddRequest(rid, processed.prompt,
                                   processed.prompt_token_ids, sent, time.time()))
    tails, walls, front = [], [], []
    while core.has_unfinished_requests():
        collected.clear()
        t0 = time.perf_counter()
        news = core.step()
        data = codec.encode(CoreOutputs(news.get(FRONT, [])))
        t1 = time.perf_counter()
        outputs = news.get(FRONT, [])
        if collected and len(outputs) == CLIENTS:  # a decode step of all 64
            tails.append(t1 - collected[-1])
            walls.append(t1 - t0)
        if own_text:
            f0 = time.perf_counter()
            for out in codec.decode_core(data).outputs:
                if text.owns(out.request_id):
                    text.update(out)
            if len(outputs) == CLIENTS:
                front.append(time.perf_counter() - f0)
    engine.runner.collect = real_collect
    result = dict(decode_steps=len(tails),
                  core_host_tail_ms=1e3 * statistics.median(tails),
                  core_step_ms=1e3 * statistics.median(walls))
    if front:
        result["front_end_text_ms"] = 1e3 * statistics.median(front)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/frontend-detok-cpu.json")
    ns = ap.parse_args()
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineArgs(max_num_seqs=CLIENTS, max_model_len=256,
                                  max_num_batched_tokens=2048))
    _run(engine, own_text=True)  # compiles every bucket the runs use
    runs = {"core_detokenizes": _run(engine, own_text=False),
            "front_end_detokenizes": _run(engine, own_text=True)}
    before = runs["core_detokenizes"]["core_host_tail_ms"]
    after = runs["front_end_detokenizes"]["core_host_tail_ms"]
    result = dict(
        what=(f"engine-core host time per decode step, {CLIENTS} streaming "
              f"requests x {OUTPUT_LEN} tokens, embedded SmolLM2-135M, "
              "with and without core-side detokenization"),
        device="CPU", **run_stamp(), command="python benchmarks/frontend_detok.py",
        summary=dict(core_host_tail_ms_saved=before - after,
                     core_host_tail_fraction=after / before),
        runs=runs)
    with open(ns.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
