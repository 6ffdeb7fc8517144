"""What the command line shows on stderr while it waits: the engine's own
log lines, and a ticking note for steps that take a while (loading a model,
compiling a step), so a first run never looks hung."""

from __future__ import annotations

import contextlib
import logging
import threading
import time


def show_engine_logs() -> None:
    """jaxinfer's INFO lines (model loaded, weight cache built, ...) on
    stderr, tersely; other libraries stay at their own levels."""
    log = logging.getLogger("jaxinfer")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[jaxinfer] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class Status:
    """``say`` prints a line; ``running(what)`` shows ``what... Ns`` on one
    line, refreshed each second, once it has taken ``after`` seconds."""

    def __init__(self, stream):
        self.stream = stream
        self.interactive = stream.isatty()

    def say(self, text: str) -> None:
        print(f"[jaxinfer] {text}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def running(self, what: str, after: float = 0.0):
        done = threading.Event()
        shown: list[float] = []
        t0 = time.perf_counter()

        def tick():
            wait = after
            while not done.wait(wait):
                seconds = time.perf_counter() - t0
                if self.interactive:
                    print(f"\r[jaxinfer] {what}... {seconds:.0f}s", end="",
                          file=self.stream, flush=True)
                elif not shown:  # a log file gets one line, not a ticker
                    print(f"[jaxinfer] {what}...", file=self.stream, flush=True)
                shown.append(seconds)
                wait = 1.0

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            if shown and self.interactive:
                print(f"\r[jaxinfer] {what}: {time.perf_counter() - t0:.1f}s",
                      file=self.stream, flush=True)
