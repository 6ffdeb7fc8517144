"""`--data-parallel-size 2` on two fake CPU devices (a subprocess): under a
concurrent load through the async engine both replicas take requests
(counts within 20%) and both step; a conversation's next turn goes back to
the replica holding its prefix pages, although the other one is idle, and
hits them there. (Equality with one device: tests/sharding/
test_pipeline_parallel.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = textwrap.dedent("""
    import asyncio, json, os, random, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import SamplingParams
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine

    args = EngineArgs(model=sys.argv[1], data_parallel_size=2,
                      num_gpu_blocks_override=96, max_model_len=256,
                      max_num_seqs=4, compilation_cache_dir="")
    engine = AsyncLLMEngine.from_engine_args(args)
    front = engine.engine
    rng = random.Random(0)

    async def run(i, prompt, max_tokens, delay=0.0):
        await asyncio.sleep(delay)
        sp = SamplingParams(max_tokens=max_tokens, temperature=0,
                            ignore_eos=True)
        async for out in engine.generate({"prompt_token_ids": prompt}, sp,
                                         f"r{i}"):
            pass
        return len(out.outputs[0].token_ids)

    def tokens(n):
        return [rng.randrange(1, 49152) for _ in range(n)]

    async def main():
        out = {}
        # Load: 40 requests of random lengths arriving over ~0.2 s.
        jobs = [run(i, tokens(rng.randrange(4, 40)), rng.randrange(2, 12),
                    delay=rng.random() * 0.2) for i in range(40)]
        done = await asyncio.gather(*jobs)
        out["completed"] = sum(1 for n in done if n > 0)
        out["counts"] = front.replica_request_counts
        out["steps"] = [r.num_steps for r in front.replicas]
        # A conversation: its first turn runs long on one replica; the
        # next turn repeats it and comes while the other replica is idle.
        first = tokens(80)
        before = list(front.router.assigned)
        long_turn = asyncio.ensure_future(run(100, first, 64))
        while front.scheduler.num_running == 0:
            await asyncio.sleep(0.005)
        holder = [a - b for a, b in zip(front.router.assigned, before)].index(1)
        hits = [r.get_stats().prefix_cache_hits for r in front.replicas]
        mid = list(front.router.assigned)
        await run(101, first + tokens(5), 2)
        out["holder"] = holder
        out["next_turn"] = [a - b for a, b in zip(front.router.assigned,
                                                  mid)].index(1)
        out["hits"] = [r.get_stats().prefix_cache_hits - h
                       for r, h in zip(front.replicas, hits)]
        await long_turn
        return out

    print("RESULT" + json.dumps(asyncio.run(main())))
    engine.shutdown()
""")


def test_load_spreads_and_a_prefix_comes_back(tiny_model_factory):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, tiny_model_factory()],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    assert res["completed"] == 40
    a, b = res["counts"]
    assert a + b == 40 and abs(a - b) <= 0.2 * max(a, b), res["counts"]
    assert min(res["steps"]) >= 0.3 * max(res["steps"]), res["steps"]
    assert res["next_turn"] == res["holder"]
    # 80 prompt tokens = 5 pages of 16; the last prompt token is always
    # computed, so at least 4 pages (64 tokens) are hits, on the holder.
    assert res["hits"][res["holder"]] >= 64
    assert res["hits"][1 - res["holder"]] == 0
