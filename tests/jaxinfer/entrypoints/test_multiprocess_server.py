"""The multi-process server (an engine-core process, HTTP front ends that
never import JAX): the same greedy tokens as `LLM.generate`, metrics
merged across front ends, and the death of either kind of process."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from .test_lifecycle import REPO, Launched

pytestmark = pytest.mark.slow

PROMPTS = ["Hello", "Once upon a time", "The capital of France is"]
# lifecycle_server.py's engine arguments.
ENGINE_KWARGS = dict(max_model_len=512, num_gpu_blocks_override=256,
                     max_num_seqs=2, max_num_batched_tokens=128)


def core_pid(server: Launched) -> int:
    found = re.search(r"engine core pid (\d+)", server.output())
    assert found, server.output()
    return int(found.group(1))


def frontend_pids(server: Launched) -> list[int]:
    """The server's front-end processes (its children but the core and
    multiprocessing's resource tracker)."""
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    out = []
    for c in children:
        with open(f"/proc/{c}/cmdline", "rb") as f:
            if b"spawn_main" in f.read() and c != core_pid(server):
                out.append(c)
    return out


def connection_owner(server_port: int, client_port: int, pids: list[int]):
    """Which of ``pids`` holds the server side of a localhost connection."""
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if (int(local.split(":")[1], 16) == server_port
                    and int(remote.split(":")[1], 16) == client_port):
                inode = fields[9]
    if inode is None:
        return None
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


class Stream:
    """A streamed completion read on a thread: its SSE payloads, or the
    error that cut it."""

    def __init__(self, port: int, body: dict):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.conn.request("POST", "/v1/completions",
                          body=json.dumps(dict(body, stream=True)),
                          headers={"Content-Type": "application/json"})
        self.client_port = self.conn.sock.getsockname()[1]
        self.events: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            response = self.conn.getresponse()
            for raw in response:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    self.events.append(line[6:])
        except Exception as e:  # noqa: BLE001 - recorded for the test
            self.error = e

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive()

    def tokens(self) -> int:
        return sum(1 for e in self.events if e != "[DONE]"
                   and json.loads(e).get("choices"))


@pytest.fixture(scope="module")
def mp_server(tiny_model_factory, tmp_path_factory):
    server = Launched(tiny_model_factory(), tmp_path_factory.mktemp("mp"),
                      mode="2")
    yield server
    server.stop()


def test_front_end_imports_no_jax(tiny_model_factory, tmp_path):
    """A front end (its client, tokenizer, image processor and app) is
    built from the core's CoreInfo, as the server sends it, without JAX."""
    import pickle

    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.core_info import CoreInfo
    from jaxinfer.engine.engine_client import ServedModel
    from jaxinfer.models.config import load_hf_config, model_config_from_hf
    from jaxinfer.models.tokenizer_source import TokenizerSource
    path = tiny_model_factory()
    config = model_config_from_hf(load_hf_config(path))
    info = CoreInfo(ServedModel(EngineArgs(model=path), config.vocab_size, 128,
                                4, (0,), False), config, path,
                    TokenizerSource(path), 20, None, 0, 0.0)
    (tmp_path / "info.pickle").write_bytes(pickle.dumps(info))
    script = f"""
import pickle, sys
from jaxinfer.engine.mp_client import MPEngineClient
from jaxinfer.entrypoints.openai import serve_processes
from jaxinfer.entrypoints.openai.api_server import build_app
with open({str(tmp_path / "info.pickle")!r}, "rb") as f:
    info = pickle.load(f)
client = MPEngineClient("ipc:///nonexistent", info)
build_app(client, ["tiny"])
client.input_processor.process("Hello")
print("jax" in sys.modules, "jaxlib" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["False", "False"], out.stdout


def test_server_front_ends_hold_no_jax(mp_server):
    """The running front ends have no JAX library mapped; the core has."""
    def maps_jax(pid: int) -> bool:
        with open(f"/proc/{pid}/maps") as f:
            return "jaxlib" in f.read()
    pids = frontend_pids(mp_server)
    assert len(pids) == 2
    assert not any(maps_jax(p) for p in pids)
    assert maps_jax(core_pid(mp_server))


def test_greedy_tokens_match_llm_generate(mp_server, tiny_model_factory):
    from jaxinfer import LLM, SamplingParams
    llm = LLM(model=tiny_model_factory(), **ENGINE_KWARGS)
    expected = [o.outputs[0].token_ids for o in llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    got = []
    for prompt in PROMPTS:
        r = requests.post(mp_server.base_url + "/v1/completions", json={
            "model": "tiny", "prompt": prompt, "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True},
            timeout=60)
        assert r.status_code == 200, r.text
        got.append(r.json()["choices"][0]["token_ids"])
    assert got == expected


def test_metrics_are_merged_across_front_ends(mp_server):
    def successes() -> float:
        text = requests.get(mp_server.base_url + "/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("jaxinfer:request_success_total"))
    before = successes()
    for _ in range(6):  # new connections: spread over both front ends
        r = requests.post(mp_server.base_url + "/v1/completions", json={
            "prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
    readings = {successes() for _ in range(6)}
    assert readings == {before + 6}


def test_killed_front_end_loses_no_other_requests(tiny_model_factory, tmp_path):
    server = Launched(tiny_model_factory(), tmp_path, mode="2")
    (tmp_path / "slow").touch()  # 200 tokens take over 4 s
    try:
        pids = frontend_pids(server)
        body = {"prompt": "Once upon a time", "max_tokens": 200,
                "ignore_eos": True, "temperature": 0}
        streams: dict[int, list[Stream]] = {p: [] for p in pids}
        deadline = time.time() + 60
        while min(len(s) for s in streams.values()) < 1:
            assert time.time() < deadline, "connections all went to one"
            stream = Stream(server.port, body)
            owner = None
            while owner is None and time.time() < deadline:
                owner = connection_owner(server.port, stream.client_port, pids)
            streams[owner].append(stream)
        victim, survivor = pids
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        for s in streams[survivor]:
            s.join(60)
            assert s.error is None and s.events[-1] == "[DONE]", s.events[-2:]
            assert s.tokens() == 200
        for s in streams[victim]:
            s.join(60)
            assert s.error is not None or s.events[-1:] != ["[DONE]"]
        # The victim's requests were aborted: the core is idle again and
        # the survivor serves.
        r = requests.post(server.base_url + "/v1/completions", json={
            "prompt": "Hi", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200, r.text
        running = [line for line in requests.get(
            server.base_url + "/metrics", timeout=30).text.splitlines()
            if line.startswith("jaxinfer:num_requests_running")]
        assert running and float(running[0].rsplit(" ", 1)[1]) == 0
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_killed_engine_core_is_answered(tiny_model_factory, tmp_path):
    server = Launched(tiny_model_factory(), tmp_path, mode="2")
    (tmp_path / "slow").touch()
    try:
        # Slow steps: 480 tokens take over 9 s, so none ends before the kill.
        body = {"prompt": "Once upon a time", "max_tokens": 480,
                "ignore_eos": True, "temperature": 0}
        streams = [Stream(server.port, body) for _ in range(3)]
        deadline = time.time() + 60
        # Two run (max_num_seqs=2), whichever arrived first; one waits.
        while sorted(len(s.events) for s in streams)[-2] < 3:
            assert time.time() < deadline
            time.sleep(0.01)
        os.kill(core_pid(server), signal.SIGKILL)
        # /health reports the death for a moment before the front ends exit.
        statuses = []
        deadline = time.time() + 10
        while 500 not in statuses and time.time() < deadline:
            try:
                statuses.append(requests.get(server.base_url + "/health",
                                             timeout=5).status_code)
            except requests.ConnectionError:
                statuses.append(None)
            time.sleep(0.02)
        assert 500 in statuses, (statuses[-5:], server.output())
        for s in streams:
            s.join(10)
            assert s.error is None and s.events[-1] == "[DONE]", (
                s.events[-2:], s.error, server.output())
            err = json.loads(s.events[-2]).get("error")
            assert err is not None, (s.events[-3:], len(s.events))
            assert err["code"] == 500 and "engine" in err["message"], err
        assert server.proc.wait(30) == 1, server.output()
    finally:
        server.stop()

