"""`jaxinfer serve` started as a user starts it, for the tests of the
multi-process server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import requests

from .test_lifecycle import REPO


class CliServer:
    """`jaxinfer serve` as a user starts it (the engine core split off)."""

    def __init__(self, model: str, tmp, *flags: str, env: dict | None = None):
        from .conftest import free_port
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "serve.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jaxinfer", "serve", model, "--port",
             str(self.port), "--served-model-name", "tiny",
             "--uvicorn-log-level", "warning", "--no-warmup", *flags],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=REPO, **(env or {})))
        deadline = time.time() + 240
        while True:
            assert self.proc.poll() is None, self.output()
            assert time.time() < deadline, "the server did not start"
            try:
                if requests.get(self.base_url + "/health",
                                timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def gauge(self, name: str) -> float:
        text = requests.get(self.base_url + "/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()

