"""The engine-core process's loop stops on SIGTERM at once, whichever of
its threads the signal lands on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

# An idle core loop whose own poll would sleep a minute, with SIGTERM
# blocked in its main thread so that the kernel delivers it to another
# thread: only the signal's wake-up byte can end the poll in time.
CHILD = textwrap.dedent("""
    import os, signal, threading, time
    from jaxinfer.engine import core_process

    core_process._IDLE_POLL_MS = 60_000

    class IdleCore:
        engine = None
        def has_unfinished_requests(self): return False
        def record_stats(self): pass
        def fail_all(self): pass

    loop = core_process.CoreLoop(IdleCore(), f"ipc://@jaxinfer-test-{os.getpid()}", [])
    loop.install_signal_handlers()
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print("ready", flush=True)
    print("stopped", loop.run(), flush=True)
""")


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signals")
def test_sigterm_on_another_thread_stops_an_idle_loop():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.2)  # the loop is in its poll
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert out.strip() == "stopped 0"
    assert took < 10, took  # not the poll's minute
