"""The server as a supervisor sees it, each in a process of its
own: a 10 MB body refused without slowing a stream, SIGTERM drains within
the grace period, and an engine-loop death answers every client at once,
reports itself on /health and exits non-zero."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest
import requests

from .conftest import free_port

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
GRACE = 3.0  # --shutdown-grace-period of the launched servers
DEATH_GRACE = 8.0  # ... of the one whose engine dies (exit includes teardown)


class Launched:
    """The server in its own process; files in ``control`` steer its engine
    step (see lifecycle_server.py)."""

    def __init__(self, model: str, control, grace: float = GRACE,
                 mode: str = "single"):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.control = control
        log_path = str(control / "server.log")
        cmd = [sys.executable, "-m", "tests.jaxinfer.entrypoints.lifecycle_server",
               model, str(self.port), str(grace), str(control), mode]
        env = dict(os.environ, PYTHONPATH=REPO)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 240
        while True:
            assert self.proc.poll() is None, self.output()
            assert time.time() < deadline, "the server did not start"
            try:
                if requests.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


def timed_stream(base_url: str, body: dict, events: list) -> None:
    """Appends (time, payload) per SSE event of a streamed completion; a
    non-streaming answer (an error) is appended as (time, status, json)."""
    with requests.post(base_url + "/v1/completions", json=dict(body, stream=True),
                       stream=True, timeout=300) as r:
        if r.status_code != 200:
            events.append((time.perf_counter(), r.status_code, r.json()))
            return
        for line in r.iter_lines(chunk_size=None, decode_unicode=True):
            if line.startswith("data: "):
                events.append((time.perf_counter(), line[6:]))


def token_times(events) -> list[float]:
    return [t for t, payload in events
            if payload != "[DONE]" and json.loads(payload).get("choices")]


def stream_token_times(base_url: str, max_tokens: int) -> list[float]:
    events: list = []
    timed_stream(base_url, {"prompt": "Once upon a time", "max_tokens": max_tokens,
                            "ignore_eos": True, "temperature": 0}, events)
    times = token_times(events)
    assert len(times) >= max_tokens // 2
    return times[1:]  # from the first decode on (the prefill is apart)


def gaps(times: list[float]) -> list[tuple[float, float]]:
    return list(zip(times, times[1:]))


_BODY = b"a" * (10 * 1024 * 1024)  # made once: the sender must not hold the GIL


def send_oversized(base_url: str) -> int | None:
    """Posts a 10 MB body announced by Content-Length, as a client would,
    reading the answer even when the server closes the connection before
    the body is sent (as urllib3 and httpcore do); returns the status the
    server answered (None if none came)."""
    host, port = base_url.rsplit("/", 1)[1].split(":")
    head = ""
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(_BODY)}\r\n"
                  "\r\n".encode())
        try:
            s.sendall(_BODY)
        except OSError:  # closed by the server: its answer may be waiting
            pass
        try:
            head = s.recv(4096).decode("latin-1")
        except OSError:
            pass
    return int(head.split()[1]) if head.startswith("HTTP/1.1") else None


# Both ways of serving: the engine in the HTTP process, and an engine-core
# process with two HTTP front ends.
MODES = ["single", "2"]


@pytest.fixture(scope="module", params=MODES)
def launched(request, tiny_model_factory, tmp_path_factory):
    server = Launched(tiny_model_factory(), tmp_path_factory.mktemp("serve"),
                      mode=request.param)
    yield server
    server.stop()


def test_refusing_10mb_bodies_does_not_slow_a_stream(launched):
    """Inter-token gaps of a stream that overlap the refusal of a 10 MB body
    (sent one after another, as a retrying client would) stay under twice
    the gaps of the same stream while nothing is being refused. Refusing
    and quiet phases alternate within the one stream, so both medians are
    taken on the same machine load (a test worker beside this one changes
    it from second to second)."""
    base = launched.base_url
    (launched.control / "paced").touch()  # steps as long as a real model's
    stream_token_times(base, 20)  # warm: compile what a stream needs
    stop, windows = threading.Event(), []

    def refuse_in_phases():
        while not stop.is_set():
            phase_end = time.perf_counter() + 0.4
            while time.perf_counter() < phase_end and not stop.is_set():
                t0 = time.perf_counter()
                status = send_oversized(base)
                windows.append((t0, time.perf_counter(), status))
                stop.wait(0.05)
            stop.wait(0.4)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        refusing = pool.submit(refuse_in_phases)
        time.sleep(0.1)
        try:  # the server's max_model_len is 512
            times = stream_token_times(base, 480)
        finally:
            stop.set()
        refusing.result(60)

    def near_a_refusal(a, b, margin):
        return any(a < end + margin and b > start - margin
                   for start, end, _ in windows)
    during = [b - a for a, b in gaps(times) if near_a_refusal(a, b, 0)]
    # Quiet: at least 0.1 s from any refusal, so none of its work lingers.
    quiet = [b - a for a, b in gaps(times) if not near_a_refusal(a, b, 0.1)]
    loaded, normal = statistics.median(during), statistics.median(quiet)
    print(f"\nmedian inter-token gap: quiet {normal * 1e3:.2f} ms ({len(quiet)} "
          f"gaps), while one of {len(windows)} 10 MB bodies was being refused "
          f"{loaded * 1e3:.2f} ms ({len(during)} gaps)")
    (launched.control / "paced").unlink()
    assert len(windows) >= 3 and {w[2] for w in windows} == {413}, windows[:5]
    assert len(during) >= 10 and len(quiet) >= 10
    assert loaded < 2 * normal, (loaded, normal)


def test_sigterm_drains_within_the_grace_period(launched):
    base = launched.base_url
    (launched.control / "slow").touch()  # 480 tokens then take > 9 s
    long_body = {"prompt": "Once upon a time", "max_tokens": 480,
                 "ignore_eos": True, "temperature": 0}
    short, long_, waiting = [], [], []
    threads = [threading.Thread(target=timed_stream, args=args) for args in (
        (base, long_body, long_),
        (base, dict(long_body, max_tokens=40), short),
        (base, long_body, waiting))]
    for t in threads:
        t.start()
        time.sleep(0.2)
    deadline = time.time() + 30
    while len(short) < 2 and time.time() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    launched.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(requests.ConnectionError):  # no longer accepting
        requests.get(base + "/health", timeout=5)
    for t in threads:
        t.join(GRACE + 10)
        assert not t.is_alive()
    rc = launched.proc.wait(GRACE + 10)
    exited = time.perf_counter() - t0
    assert rc == 0, launched.output()  # a drain is a clean exit
    assert exited < GRACE + 3, exited
    # The short request finished normally; the long ones were failed with a
    # 503 at the end of the grace period: every client got an answer.
    assert short[-1][1] == "[DONE]" and short[-1][0] > t0  # was in flight
    assert json.loads(short[-2][1])["choices"][0]["finish_reason"] == "length"
    for events in (long_, waiting):
        assert events[-1][1] == "[DONE]", events[-3:]
        last = json.loads(events[-2][1])
        assert "error" in last, events[-3:]  # what ended the stream instead
        err = last["error"]
        assert err["code"] == 503 and "grace period" in err["message"]
        assert GRACE - 0.5 < events[-1][0] - t0 < GRACE + 2


@pytest.mark.parametrize("mode", MODES)
def test_engine_death_answers_everyone_and_exits_non_zero(tiny_model_factory,
                                                          tmp_path, mode):
    server = Launched(tiny_model_factory(), tmp_path, grace=DEATH_GRACE,
                      mode=mode)
    # Paced steps: unpaced, the tiny model's 480 tokens can all stream in
    # the 0.3 s before the fault, and then there is nothing left to fail.
    # The queued two start only once both streams run: started together,
    # a queued one could take a stream's seat, and that stream would then
    # wait behind it while the other ran to its end.
    (tmp_path / "paced").touch()
    try:
        base = server.base_url
        body = {"prompt": "Once upon a time", "max_tokens": 480,
                "ignore_eos": True, "temperature": 0}
        streams = [[], []]  # running (max_num_seqs=2)
        threads = [threading.Thread(target=timed_stream, args=(base, body, ev))
                   for ev in streams]
        answers: dict[int, tuple[float, int, dict]] = {}

        def waiting(i):  # queued behind the two running streams
            r = requests.post(base + "/v1/completions", json=body, timeout=300)
            answers[i] = (time.perf_counter(), r.status_code, r.json())

        queued = [threading.Thread(target=waiting, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while min(len(s) for s in streams) < 3 and time.time() < deadline:
            time.sleep(0.01)
        threads += queued
        for t in queued:
            t.start()
        time.sleep(0.3)  # the waiting two are queued by now
        t0 = time.perf_counter()
        (tmp_path / "fault").touch()
        for t in threads:
            t.join(10)
            assert not t.is_alive()
        health = requests.get(base + "/health", timeout=5)
        for events in streams:
            assert events[-1][1] == "[DONE]", events[-3:]
            # The error is the stream's last event before [DONE]; the tail
            # is in the message when it is not (a stream that ended first).
            last = json.loads(events[-2][1])
            assert "error" in last, (events[-3:], server.output())
            err = last["error"]
            assert err["code"] == 500 and "planted fault" in err["message"]
            assert events[-1][0] - t0 < 1.0
        for t_answer, status, payload in answers.values():
            assert status == 500, (status, payload)
            assert "planted fault" in payload["error"]["message"], payload
            assert t_answer - t0 < 1.0
        assert health.status_code == 500
        assert "planted fault" in health.json()["error"]["message"]
        rc = server.proc.wait(DEATH_GRACE + 5)
        exited = time.perf_counter() - t0
        print(f"\nexited {exited:.2f} s after the fault, status {rc}")
        assert rc == 1, server.output()
        assert exited < DEATH_GRACE
    finally:
        server.stop()
