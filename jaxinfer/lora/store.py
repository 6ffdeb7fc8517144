"""`AdapterStore`: loaded adapters in host memory, by ``lora_int_id``.

An LRU of ``max_cpu_loras`` adapters read from disk (vLLM's CPU LoRA
cache) that feeds the device slots. Adapters of requests in flight are
held (``acquire`` / ``release``) and never evicted, so the runner finds
every adapter a step needs without touching the disk; loading happens on
the thread that checks a request (a server's worker thread), never on the
engine loop.

An id names one adapter at a time: a request whose id is held by requests
in flight for another adapter (another name or folder) is refused, and an
id whose folder changed on disk is read again (its pages in the prefix
cache and its device slot are keyed by the new weights, `LoRAAdapter.key`).

Thread-safe: worker threads load, the engine loop acquires and releases.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading

from .errors import LoRAError
from .layout import SlotLayout
from .peft_format import LoRAAdapter, adapter_key, load_peft_adapter
from .request import LoRARequest

logger = logging.getLogger(__name__)


class AdapterStore:
    def __init__(self, layout: SlotLayout, dtype, capacity: int,
                 stage=None):
        self.layout = layout
        # Puts a read adapter's buffer where slot loads copy it from
        # (`LoRAPool.stage`: pinned host memory on a GPU), on the loading
        # thread, so a slot load on the engine loop is one fast copy.
        self.stage = stage
        self.dtype = dtype
        self.capacity = capacity
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[int, LoRAAdapter] = \
            collections.OrderedDict()  # least recently used first
        self._users: dict[int, set[str]] = {}  # id -> request ids in flight
        self._held_by: dict[str, int] = {}  # request id -> adapter id
        self._pinned: set[int] = set()  # pin_lora: never evicted
        self._removed: set[int] = set()  # remove_lora while held: drop when free
        self.num_loads = 0  # adapters read from disk since start

    # -- loading (any thread) -----------------------------------------------

    def load(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter, from the cache or read from disk (typed errors:
        `LoRAError` and subclasses)."""
        if not isinstance(request, LoRARequest):
            raise LoRAError(f"lora_request must be a LoRARequest, got "
                            f"{type(request).__name__}")
        key = adapter_key(request)
        with self._lock:
            cached = self._cache.get(request.lora_int_id)
            if cached is not None and cached.key == key:
                self._cache.move_to_end(request.lora_int_id)
                self._removed.discard(request.lora_int_id)  # wanted again
                return cached
            self._check_free(request, cached)
        adapter = load_peft_adapter(request, self.layout, self.dtype)
        if self.stage is not None:
            adapter = dataclasses.replace(adapter, flat=self.stage(adapter.flat))
        with self._lock:
            self._check_free(request, self._cache.get(request.lora_int_id))
            self._cache[request.lora_int_id] = adapter
            self._cache.move_to_end(request.lora_int_id)
            self._removed.discard(request.lora_int_id)
            self.num_loads += 1
            self._evict(keep=request.lora_int_id)
        logger.info("loaded LoRA adapter %r (id %d, rank %d, %d layers) from "
                    "%s", request.lora_name, request.lora_int_id, adapter.rank,
                    len(adapter.modules), request.lora_path)
        return adapter

    def _check_free(self, request: LoRARequest, cached: LoRAAdapter | None):
        """An id held by requests in flight cannot change adapter."""
        if (cached is not None and self._users.get(request.lora_int_id)
                and (cached.request.lora_name, cached.request.lora_path)
                != (request.lora_name, request.lora_path)):
            raise LoRAError(
                f"lora_int_id {request.lora_int_id} belongs to LoRA adapter "
                f"{cached.request.lora_name!r} ({cached.request.lora_path}) "
                f"while requests using it run; give {request.lora_name!r} its "
                "own lora_int_id")

    # -- requests in flight (the engine loop) ---------------------------------

    def acquire(self, request_id: str, adapter: LoRAAdapter) -> None:
        """Holds ``adapter`` for a request until ``release``: it stays in
        host memory (put back if it was evicted since it was loaded)."""
        rid = adapter.lora_int_id
        with self._lock:
            cached = self._cache.get(rid)
            if cached is not adapter:
                if cached is not None and self._users.get(rid) and (
                        cached.key != adapter.key):
                    raise LoRAError(
                        f"lora_int_id {rid} now names LoRA adapter "
                        f"{cached.request.lora_name!r} "
                        f"({cached.request.lora_path}); give each adapter its "
                        "own lora_int_id")
                self._cache[rid] = adapter
            self._cache.move_to_end(rid)
            self._users.setdefault(rid, set()).add(request_id)
            self._held_by[request_id] = rid

    def release(self, request_ids) -> None:
        """Requests that finished: their adapters may be evicted again."""
        with self._lock:
            for request_id in request_ids:
                rid = self._held_by.pop(request_id, None)
                if rid is not None:
                    users = self._users.get(rid, set())
                    users.discard(request_id)
                    if not users:
                        self._users.pop(rid, None)
            self._evict()

    def get(self, lora_int_id: int) -> LoRAAdapter | None:
        with self._lock:
            return self._cache.get(lora_int_id)

    # -- vLLM's add_lora / remove_lora / pin_lora / list_loras ---------------

    def remove(self, lora_int_id: int) -> bool:
        """Forgets an adapter (requests in flight keep theirs until they
        finish). False if it was not loaded."""
        with self._lock:
            self._pinned.discard(lora_int_id)
            if lora_int_id not in self._cache:
                return False
            if self._users.get(lora_int_id):
                self._removed.add(lora_int_id)
            else:
                del self._cache[lora_int_id]
            return True

    def pin(self, lora_int_id: int) -> bool:
        with self._lock:
            if lora_int_id not in self._cache:
                return False
            self._pinned.add(lora_int_id)
            return True

    def ids(self) -> set[int]:
        with self._lock:
            return set(self._cache)

    def _evict(self, keep: int | None = None) -> None:
        """Least recently used first, skipping held and pinned adapters and
        ``keep`` (just loaded for a request about to hold it); held ones may
        keep the cache above capacity until released."""
        for rid in [r for r in self._removed if not self._users.get(r)]:
            self._removed.discard(rid)
            self._cache.pop(rid, None)
        excess = len(self._cache) - self.capacity
        for rid in list(self._cache):
            if excess <= 0:
                break
            if (rid != keep and rid not in self._pinned
                    and not self._users.get(rid)):
                del self._cache[rid]
                excess -= 1
