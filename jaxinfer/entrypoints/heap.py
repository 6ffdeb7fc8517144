"""The Python heap of a long-running engine process.

Importing JAX, Flax and the engine leaves hundreds of thousands of objects
that Python's cyclic collector tracks and that live as long as the process.
Every collection of the oldest generation walks all of them: a long pause
on the host, during which an overlapped engine has one step queued and the
device then idles (docs/performance.md, "Keeping the device busy").
`gc.freeze` moves what exists at start into a generation the collector
never walks, as vLLM does for its engine process.

What the run itself allocates and keeps (requests, their block hashes, the
page pool's bookkeeping) still fills the oldest generation, and with the
start-up heap frozen the collector finds that generation "grown by a
quarter" sooner, so it walks it more often. While frozen, the oldest
generation is collected a tenth as often (its threshold 10 -> 100 younger
collections); cycles are rare in a steady engine loop, and they are still
collected, later.

It is done only where one engine is the process's whole job (`jaxinfer
serve`, `jaxinfer bench`), and undone when that job ends: freezing inside
`LLM()` would keep the cycles of every engine a notebook or test later drops
alive for the rest of the process.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def startup_heap_frozen() -> Iterator[int]:
    """Collects garbage, then freezes every object alive now and makes
    full collections rarer for the duration of the block; yields how many
    objects were frozen."""
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], threshold[1], max(threshold[2], 100))
    try:
        yield gc.get_freeze_count()
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
