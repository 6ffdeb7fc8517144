"""Where the suite's time goes: an opt-in pytest plugin that adds up, per
test, the seconds JAX spends tracing, lowering, compiling and reading its
persistent cache (``jax.monitoring`` duration events), beside the test's
wall time. One JSON file per xdist worker::

    python -m pytest -n 2 --dist loadgroup -q -p tests.compile_report
    python -m tests.compile_report            # the table

Files go to ``$JAXINFER_COMPILE_REPORT_DIR`` (default
``<tmp>/jaxinfer-compile-report``). Compiles in processes a test starts
are not counted (they show as wall time only).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time

import pytest

REPORT_DIR = os.environ.get("JAXINFER_COMPILE_REPORT_DIR", os.path.join(
    tempfile.gettempdir(), "jaxinfer-compile-report"))

_current: dict = {"test": None}
_seconds: dict = collections.defaultdict(collections.Counter)


def _listener(event: str, duration: float, **_) -> None:
    if event.startswith(("/jax/core/compile/", "/jax/compilation_cache/")):
        _seconds[_current["test"] or "<outside tests>"][event.rsplit("/", 1)[-1]] += duration


def pytest_configure(config):
    import jax.monitoring
    jax.monitoring.register_event_duration_secs_listener(_listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["test"] = item.nodeid
    t0 = time.perf_counter()
    yield
    _seconds[item.nodeid]["wall"] += time.perf_counter() - t0
    _current["test"] = None


def pytest_sessionfinish(session):
    os.makedirs(REPORT_DIR, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(REPORT_DIR, f"{worker}.json"), "w") as f:
        json.dump({k: dict(v) for k, v in _seconds.items()}, f)


def summarize(directory: str = REPORT_DIR, top: int = 25) -> str:
    tests: dict = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                tests.update(json.load(f))
    totals: collections.Counter = collections.Counter()
    for v in tests.values():
        totals.update(v)
    lines = [f"{len(tests)} tests; seconds summed over tests: " + ", ".join(
        f"{k} {v:.0f}" for k, v in totals.most_common())]
    lines.append(f"{'wall':>7} {'compile':>8}  test")
    for k, v in sorted(tests.items(), key=lambda kv: -kv[1].get("wall", 0))[:top]:
        lines.append(f"{v.get('wall', 0):7.1f} "
                     f"{v.get('backend_compile_duration', 0):8.1f}  {k}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(*sys.argv[1:2]))
