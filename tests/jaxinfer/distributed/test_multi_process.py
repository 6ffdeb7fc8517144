"""One engine over two processes on localhost (``jax.distributed``, gloo CPU
collectives, two fake devices each): tensor parallelism inside each
process, pipeline stages across them. Process 0 serves the LLM API and
broadcasts each step; process 1 is started as `jaxinfer serve ...
--process-id 1` would be. Same outputs as one process, and each process
reads only its own stage's tensors. Processes started with different
settings both fail at start, naming the setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.jaxinfer.entrypoints.conftest import free_port

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
PROMPTS = ["Hello there, how are you doing", "x", "The capital of France is"]

# Counts the checkpoint tensors a process reads, then runs its role.
_PROCESS = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer.models.safetensors_loader import SafetensorsReader
    reads = []
    real_get = SafetensorsReader.get
    def counting_get(self, name):
        reads.append(name)
        return real_get(self, name)
    SafetensorsReader.get = counting_get
    role, flags = sys.argv[1], json.loads(sys.argv[2])
    if role == "worker":
        from jaxinfer.entrypoints.cli import main
        rc = main(["serve", *flags])
        print("READS", len(reads), flush=True)
        sys.exit(rc)
    from jaxinfer import LLM
    from tests.jaxinfer.distributed.test_multi_process import generate_all
    llm = LLM(**flags)
    print("RESULT" + json.dumps(generate_all(llm)), flush=True)
    print("READS", len(reads), flush=True)
""")


def generate_all(llm) -> dict:
    """Greedy tokens, and seeded sampling with penalties and logprobs (the
    penalty counts and sampling arrays travel with each step too)."""
    from jaxinfer import SamplingParams
    greedy = SamplingParams(max_tokens=6, temperature=0)
    sampled = SamplingParams(max_tokens=6, temperature=0.8, top_k=10, seed=3,
                             presence_penalty=0.5, logprobs=2)
    outs = llm.generate(PROMPTS, [greedy] * 2 + [sampled], use_tqdm=False)
    return {"tokens": [o.outputs[0].token_ids for o in outs],
            "logprobs": [[sorted(lp) for lp in o.outputs[0].logprobs]
                         for o in outs[2:]]}


def _engine_kwargs(path: str, port: int, **overrides) -> dict:
    return {**dict(model=path, num_gpu_blocks_override=64, max_model_len=128,
                   compilation_cache_dir="", tensor_parallel_size=2,
                   pipeline_parallel_size=2, num_processes=2,
                   distributed_coordinator=f"127.0.0.1:{port}"), **overrides}


def _worker_flags(kwargs: dict) -> list[str]:
    flags = [kwargs["model"], "--no-warmup", "--process-id", "1"]
    for key, value in kwargs.items():
        if key not in ("model", "process_id"):
            flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


def _launch(role: str, flags, log_path: str) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    return subprocess.Popen(
        [sys.executable, "-c", _PROCESS, role, json.dumps(flags)], cwd=REPO,
        env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


def _finish(procs, logs, timeout=600) -> list[str]:
    try:
        for p in procs:
            p.wait(timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    return [open(log).read() for log in logs]


def _line(text: str, tag: str) -> str:
    return next(l for l in text.splitlines() if l.startswith(tag))[len(tag):]


def test_two_processes_match_one(tiny_model_factory, tmp_path):
    from jaxinfer import LLM
    path = tiny_model_factory("llama", num_hidden_layers=4)
    port = free_port()
    kwargs = _engine_kwargs(path, port)
    logs = [str(tmp_path / "p0.log"), str(tmp_path / "p1.log")]
    procs = [_launch("worker", _worker_flags(kwargs), logs[1]),
             _launch("driver", dict(kwargs, process_id=0), logs[0])]
    out0, out1 = _finish(procs, logs)
    assert [p.returncode for p in procs] == [0, 0], out0[-3000:] + out1[-3000:]
    expected = generate_all(LLM(path, num_gpu_blocks_override=64,
                                max_model_len=128, compilation_cache_dir=""))
    assert json.loads(_line(out0, "RESULT")) == expected
    # 4 layers of 9 tensors, 2 per stage, + embedding, final norm, lm_head:
    # each process reads its stage's 18 and the 3 shared ones.
    assert int(_line(out0, "READS ")) == 21
    assert int(_line(out1, "READS ")) == 21


def test_processes_that_disagree_fail_naming_the_setting(tiny_model_factory,
                                                         tmp_path):
    path = tiny_model_factory("llama", num_hidden_layers=4)
    port = free_port()
    logs = [str(tmp_path / "p0.log"), str(tmp_path / "p1.log")]
    procs = [_launch("worker", _worker_flags(_engine_kwargs(
                 path, port, max_model_len=64)), logs[1]),
             _launch("driver", dict(_engine_kwargs(path, port), process_id=0),
                     logs[0])]
    out0, out1 = _finish(procs, logs, timeout=300)
    worker, driver = procs
    assert worker.returncode == 2, out1[-2000:]  # the CLI's bad-input status
    assert driver.returncode != 0, out0[-2000:]
    for out in (out0, out1):
        assert ("disagree on max_model_len (process 0: 128, process 1: 64)"
                in out), out[-2000:]
