"""Slow clients against `jaxinfer serve` in a process of its own whose file
limit is 1,024: 2,000 connections that send their headers (or a body) a
line at a time do not stop /health and a completion from answering within
a second, and each is closed with a 408 once its time is up; SIGINT then
drains and exits 0 without a traceback. Only 127.0.0.1 is reached."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from .conftest import free_port

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
FILE_LIMIT = 1024
SLOW_CLIENTS = 2000
SLOW_BODIES = 200  # the last of them: headers whole, then one body byte
TIMEOUT = 4.0  # --request-header-timeout and --request-body-timeout
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
BODY_HEAD = HEAD + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


@pytest.fixture(scope="module")
def served(tiny_model_factory, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("slow") / "server.log", "w+")
    cmd = ["prlimit", f"--nofile={FILE_LIMIT}:{FILE_LIMIT}", sys.executable,
           "-m", "jaxinfer", "serve", tiny_model_factory(), "--port", str(port),
           "--served-model-name", "tiny", "--max-model-len", "64",
           "--num-gpu-blocks-override", "32", "--max-num-seqs", "2",
           "--max-num-batched-tokens", "32", "--uvicorn-log-level", "warning",
           "--request-header-timeout", str(TIMEOUT),
           "--request-body-timeout", str(TIMEOUT)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=REPO))
    base = f"http://127.0.0.1:{port}"

    def output() -> str:
        log.flush()
        log.seek(0)
        return log.read()[-4000:]
    deadline = time.time() + 300
    while True:
        assert proc.poll() is None, output()
        assert time.time() < deadline, "the server did not start"
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(base + "/health", timeout=2).status_code == 200:
                break
        time.sleep(0.3)
    yield proc, port, base, output
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
    log.close()


@contextlib.contextmanager
def file_limit(n: int):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    try:
        status = fn().status_code
    except requests.RequestException:
        status = 0
    return time.perf_counter() - t0, status


def closed_by_server(sock: socket.socket) -> tuple[bool, bytes]:
    """(whether the server closed it, what it sent first)."""
    sock.setblocking(False)
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return False, b""
    except OSError:  # reset
        return True, b""
    return True, data  # b"" at EOF, else a response (then EOF)


def test_slow_clients_leave_health_and_completions_answering(served):
    proc, port, base, output = served

    def health():
        return requests.get(base + "/health", timeout=1)

    def complete():
        return requests.post(base + "/v1/completions", timeout=1, json={
            "model": "tiny", "prompt": "Hi", "max_tokens": 2})

    assert complete().status_code == 200  # compiled and ready
    socks: list[socket.socket] = []
    with file_limit(SLOW_CLIENTS + 200):
        try:
            t0 = time.perf_counter()
            for i in range(SLOW_CLIENTS):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                with contextlib.suppress(OSError):  # closed to make room
                    s.sendall(BODY_HEAD + b"{" if i >= SLOW_CLIENTS - SLOW_BODIES
                              else HEAD)
                socks.append(s)
            opened = time.perf_counter() - t0
            probes = []
            while time.perf_counter() - t0 < opened + TIMEOUT - 1:
                for s in socks[:-SLOW_BODIES]:  # a header line now and then
                    with contextlib.suppress(OSError):
                        s.send(b"X-Slow: 1\r\n")
                probes += [timed(health), timed(complete)]
                time.sleep(0.3)
            time.sleep(TIMEOUT + 1.5)
            results = [closed_by_server(s) for s in socks]
        finally:
            for s in socks:
                s.close()
    print(f"\n{SLOW_CLIENTS} slow connections opened in {opened:.1f} s; "
          f"{len(probes)} probes, slowest {max(p[0] for p in probes):.2f} s")
    assert probes and all(status == 200 for _, status in probes), (
        probes, output())
    assert max(elapsed for elapsed, _ in probes) < 1.0, probes
    still_open = sum(not closed for closed, _ in results)
    assert still_open == 0, f"{still_open} slow connections still open"
    answered = [data for _, data in results if data]
    assert answered and all(d.startswith(b"HTTP/1.1 408 ") for d in answered)
    # The last connections were not closed to make room: their time ran out.
    assert any(b"--request-header-timeout" in d for d in answered)
    assert any(b"--request-body-timeout" in d for d in answered)
    assert timed(health)[1] == 200 and timed(complete)[1] == 200


def test_sigint_drains_and_exits_0(served):
    proc, _, _, output = served
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0, output()
    assert "Traceback" not in output(), output()
