"""The start-up heap freeze of long-running entry points (`heap.py`)."""

import gc
import weakref

from jaxinfer.entrypoints.heap import startup_heap_frozen


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the cyclic collector frees it


def test_garbage_is_collected_first_and_the_live_heap_frozen_until_the_end():
    live = _Node()
    dropped = _Node()
    dead = weakref.ref(dropped)
    del dropped
    assert dead() is not None  # a cycle outlives its last reference
    assert gc.get_freeze_count() == 0
    threshold = gc.get_threshold()
    with startup_heap_frozen() as frozen:
        assert dead() is None  # collected before the freeze, not kept
        # Full collections are rarer meanwhile, the younger ones as before.
        assert gc.get_threshold() == (*threshold[:2], max(threshold[2], 100))
        assert frozen > 1000
        # The collector's generations no longer hold what was alive...
        assert not any(o is live for o in gc.get_objects())
        made_inside = _Node()
        # ...while what is made inside the block stays collectable.
        assert any(o is made_inside for o in gc.get_objects())
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == threshold
    assert any(o is live for o in gc.get_objects())


def test_the_freeze_is_undone_when_the_block_raises():
    try:
        with startup_heap_frozen():
            raise RuntimeError("the server stopped")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold()[2] < 100
