"""The XLA compiles (and traces) that happen while a block runs, from JAX's
monitoring events: ``with compile_events() as events: ...``."""

from __future__ import annotations

import contextlib

import jax

COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration",
                  "/jax/core/compile/jaxpr_trace_duration")


@contextlib.contextmanager
def compile_events(names=COMPILE_EVENTS):
    events: list[str] = []

    def listener(event, duration, **kwargs):
        if event in names:
            events.append(event)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
