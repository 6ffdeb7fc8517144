"""`jaxinfer serve --distributed-executor-backend ray` on a local Ray cluster
the test starts: two worker processes (one fake CPU device each) form one
tensor-parallel engine through jax.distributed. The server's greedy tokens
equal one process's; then one worker is killed while four streams run:
every stream ends with an error within seconds (none hangs), /health names
the dead worker, and the server exits 1 for its supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.jaxinfer.entrypoints.conftest import free_port

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
PROMPTS = ["Hello there, how are you doing", "The capital of France is"]
# A throwaway cluster of this test alone: no token (Ray's token file in the
# home folder is shared with any other cluster on the machine).
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}

# A Ray head in a process of its own, on the loopback address; it stops when
# its stdin closes.
_HEAD = """
import sys, ray
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
         _node_ip_address="127.0.0.1")
print("ADDRESS", ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.fixture
def ray_head(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, **RAY_ENV)
    head = subprocess.Popen([sys.executable, "-c", _HEAD], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "ray.log", "w"), text=True)
    try:
        line = head.stdout.readline()
        assert line.startswith("ADDRESS"), open(tmp_path / "ray.log").read()
        yield line.split()[1]
    finally:
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(30)


class RayServer:
    def __init__(self, model: str, address: str, log_path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=REPO, RAY_ADDRESS=address,
                   JAX_PLATFORMS="cpu", **RAY_ENV)
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jaxinfer", "serve", model,
             "--distributed-executor-backend", "ray", "-tp", "2",
             "--num-gpu-blocks-override", "64", "--max-model-len", "256",
             "--max-num-seqs", "4", "--no-warmup",
             "--compilation-cache-dir", "", "--port", str(self.port),
             "--served-model-name", "tiny", "--shutdown-grace-period", "3"],
            cwd=REPO, env=env, stdout=open(log_path, "w"),
            stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while True:
            assert self.proc.poll() is None, self.output()
            assert time.time() < deadline, "the server did not start"
            try:
                if requests.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)

    def output(self) -> str:
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def worker_pids(self) -> list[int]:
        line = next(l for l in self.output().splitlines()
                    if l.startswith("ray engine:"))
        return [int(p) for p in line.split("pids ")[1].split(" (")[0].split(", ")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def _stream(base: str, events: list) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 200,
            "ignore_eos": True, "temperature": 0, "stream": True}
    try:
        with requests.post(base + "/v1/completions", json=body, stream=True,
                           timeout=120) as r:
            for line in r.iter_lines(chunk_size=None, decode_unicode=True):
                if line.startswith("data: "):
                    events.append(line[6:])
    except requests.RequestException as e:  # the connection dropped
        events.append(f"connection error: {e}")


def test_ray_engine_matches_one_process_and_reports_a_dead_worker(
        tiny_model_factory, ray_head, tmp_path):
    from jaxinfer import LLM, SamplingParams
    path = tiny_model_factory()
    server = RayServer(path, ray_head, tmp_path / "server.log")
    try:
        pids = server.worker_pids()
        assert len(pids) == 2
        got = [requests.post(server.base + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": p, "max_tokens": 6, "temperature": 0,
            "return_token_ids": True}).json()["choices"][0]["token_ids"]
            for p in PROMPTS]
        one = LLM(path, num_gpu_blocks_override=64, max_model_len=256,
                  compilation_cache_dir="")
        expected = [o.outputs[0].token_ids for o in one.generate(
            PROMPTS, SamplingParams(max_tokens=6, temperature=0),
            use_tqdm=False)]
        assert got == expected

        streams: list[list[str]] = [[] for _ in range(4)]
        threads = [threading.Thread(target=_stream, args=(server.base, ev))
                   for ev in streams]
        for t in threads:
            t.start()
        deadline = time.time() + 120
        while min(len(s) for s in streams) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert min(len(s) for s in streams) >= 3, streams
        t0 = time.perf_counter()
        os.kill(pids[1], signal.SIGKILL)  # a follower: worker 0 then waits on it
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a stream hung after the worker died"
        ended = time.perf_counter() - t0
        health = requests.get(server.base + "/health", timeout=10)
        for events in streams:
            assert events[-1] == "[DONE]", events[-3:]
            err = json.loads(events[-2])["error"]
            assert err["code"] == 500 and "worker 1 of 2" in err["message"], err
        assert ended < 30
        assert health.status_code == 500
        assert "worker 1 of 2" in health.json()["error"]["message"]
        assert server.proc.wait(60) == 1, server.output()
    finally:
        server.stop()
