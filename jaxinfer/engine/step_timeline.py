"""The step timeline: one JSON line per engine step, to see where a run's
time goes (`--profile-steps FILE`, or ``EngineArgs(profile_steps=FILE)``).

Each record holds the step's bucket (T, S, P, decode_only), what it carried
(sequences, prefill and decode tokens, the sum of its KV lengths and of its
query-key pairs, which give each step's roofline), the host's time on it, the
device's time on it, the compile time it triggered, preemptions and the
pages in use. `benchmarks/timeline_report.py` turns a file into a table of
time against the roofline and a PNG.

Device time of step N is measured from when the device could start it (its
dispatch, or the end of step N-1 if that was later) to when its sampled
tokens were ready; with host/device overlap the host waits for step N while
step N+1 is already queued, so that end is seen as it happens.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import jax

# Compile work (tracing, lowering, XLA) and loads from the persistent cache.
_COMPILE_EVENT_PREFIXES = ("/jax/core/compile/", "/jax/compilation_cache/")
_COMPILE_EVENTS_COUNTED = ("/jax/core/compile/backend_compile_duration",
                           "/jax/compilation_cache/cache_retrieval_time_sec")


class CompileClock:
    """Seconds spent compiling (or loading compiled programs) since start,
    from jax.monitoring's duration events; one listener per process."""
    _lock = threading.Lock()
    _seconds = 0.0
    _count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        with cls._lock:
            if cls._installed:
                return
            cls._installed = True

        def listener(event: str, duration_secs: float, **_: str | int) -> None:
            if event.startswith(_COMPILE_EVENT_PREFIXES):
                with cls._lock:
                    cls._seconds += duration_secs
                    if event in _COMPILE_EVENTS_COUNTED:
                        cls._count += 1
        jax.monitoring.register_event_duration_secs_listener(listener)

    @classmethod
    def read(cls) -> tuple[float, int]:
        with cls._lock:
            return cls._seconds, cls._count


@dataclasses.dataclass
class StepRecord:
    step: int
    t_start_s: float  # since the timeline started
    T: int  # bucket: padded tokens
    S: int  # bucket: padded sequences
    P: int  # bucket: pages per sequence
    decode_only: bool
    num_seqs: int
    prefill_tokens: int  # tokens of rows with more than one token
    decode_tokens: int  # rows of exactly one token
    kv_tokens: int  # sum of the rows' KV lengths after the step
    attn_pairs: int  # query-key pairs attended (causal), over all rows
    host_ms: float  # host time on this step (schedule, pack, outputs)
    device_ms: float  # device time on this step (see the module docstring)
    compile_ms: float  # compiling / loading programs during this step
    compiles: int
    preempted: int  # requests preempted by this step's schedule
    pages_in_use: int  # when the step was scheduled
    running: int  # requests running, when the step was scheduled
    waiting: int  # requests queued, when the step was scheduled
    # Decode steps the program ran (a multi-step window: num_scheduler_steps);
    # the token and KV fields above are its first step's.
    num_steps: int = 1


@dataclasses.dataclass
class _Dispatched:
    """What the engine knew of a step when it dispatched it."""
    host_s: float  # scheduling and dispatching it, compiles included
    compile_s: float  # compiling / loading programs while dispatching it
    compiles: int
    preempted: int
    pages_in_use: int
    running: int
    waiting: int


class StepTimeline:
    """Collects StepRecords and writes them as JSON lines to ``path``.

    A step is recorded in two parts: `dispatched` when the engine has
    enqueued it, `collected` when its tokens have been turned into
    outputs; the device times come from the runner's in-flight step."""

    def __init__(self, path: str):
        CompileClock.install()
        self.path = path
        self.records: list[StepRecord] = []
        self._t0 = time.perf_counter()
        self._file = open(path, "w")
        # id(in-flight step) -> its dispatch, until it is collected.
        self._open: dict[int, _Dispatched] = {}

    def dispatched(self, step, host_s: float,
                   compile_before: tuple[float, int], preempted: int,
                   queue: tuple[int, int, int]) -> None:
        """``step``: the runner's InFlightStep; ``compile_before``:
        `CompileClock.read()` before its dispatch; ``queue``: pages in use,
        requests running and waiting when it was scheduled."""
        seconds, count = CompileClock.read()
        self._open[id(step)] = _Dispatched(
            host_s, seconds - compile_before[0], count - compile_before[1],
            preempted, *queue)

    def collected(self, step, host_s: float) -> None:
        """Records a step whose outputs took ``host_s`` to make."""
        d = self._open.pop(id(step), None)
        if d is None:  # dispatched before this timeline started
            return
        compile_ms = 1e3 * d.compile_s
        bucket = step.dims
        self.add(StepRecord(
            step=len(self.records), t_start_s=step.dispatched_at - self._t0,
            T=bucket.tokens, S=bucket.seqs, P=bucket.pages,
            decode_only=bucket.decode_only, **step_shape(step.out.scheduled),
            host_ms=max(1e3 * (d.host_s + host_s) - compile_ms, 0.0),
            device_ms=1e3 * (step.ready_at - step.device_start),
            compile_ms=compile_ms, compiles=d.compiles,
            preempted=d.preempted, pages_in_use=d.pages_in_use,
            running=d.running, waiting=d.waiting,
            num_steps=step.out.num_steps))

    def restart(self) -> None:
        """Drops what was recorded so far (a benchmark's untimed part)."""
        self._file.seek(0)
        self._file.truncate()
        self.records = []
        self._t0 = time.perf_counter()

    def add(self, record: StepRecord) -> None:
        self.records.append(record)
        self._file.write(json.dumps(dataclasses.asdict(record)) + "\n")
        if len(self.records) % 256 == 0:
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def step_shape(scheduled) -> dict:
    """What a step carries, from its scheduled rows (host ints only)."""
    prefill = decode = kv = pairs = 0
    for s in scheduled:
        q = len(s.token_ids)
        if q == 1:
            decode += 1
        else:
            prefill += q
        kv += s.start_pos + q
        pairs += q * s.start_pos + q * (q + 1) // 2
    return dict(num_seqs=len(scheduled), prefill_tokens=prefill,
                decode_tokens=decode, kv_tokens=kv, attn_pairs=pairs)
