"""Whole-page copies between the KV pool and host memory: swap out and swap
in (preemption by swap). The scheduler decides them (pairs in `SchedulerOutput`); this
module moves the bytes, before the step that needs them.

Each kind is one jitted program per count bucket (a power of two), padded
with the null page, so swaps never compile at serving time once warmed up.
The pool is donated wherever it is written. Host pages live in NumPy arrays
(per layer ``[2, K, num_host_pages, B, H]``), allocated on the first swap.
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from .buckets import _pow2_ladder, _round_up

logger = logging.getLogger(__name__)


def _gather(kv_pages, ids):
    """ids [n] -> per layer (k, v) each [K, n, B, H]."""
    return [(k[:, ids], v[:, ids]) for k, v in kv_pages]


def _scatter(kv_pages, ids, data):
    return [(k.at[:, ids].set(dk), v.at[:, ids].set(dv))
            for (k, v), (dk, dv) in zip(kv_pages, data)]


class PageMover:
    def __init__(self, num_pages: int, num_host_pages: int):
        self.num_host_pages = num_host_pages
        self.ladder = _pow2_ladder(8, max(8, 1 << (num_pages - 1).bit_length()))
        self._gather = jax.jit(_gather)
        self._scatter = jax.jit(_scatter, donate_argnums=(0,))
        self._host: list[np.ndarray] | None = None

    def _pad(self, ids: list[int]) -> np.ndarray:
        out = np.zeros(_round_up(len(ids), self.ladder), np.int32)
        out[:len(ids)] = ids
        return out

    def _host_pages(self, kv_pages) -> list[np.ndarray]:
        if self._host is None:
            k = kv_pages[0][0]
            K, _, B, H = k.shape
            self._host = [np.zeros((2, K, self.num_host_pages, B, H),
                                   np.dtype(k.dtype)) for _ in kv_pages]
            logger.info("allocated %.2f GiB of host swap space",
                        sum(h.nbytes for h in self._host) / 2**30)
        return self._host

    def swap_out(self, kv_pages, pairs: list[tuple[int, int]]) -> None:
        """Copies device pages to host slots ``(device_page, host_slot)``."""
        if not pairs:
            return
        host = self._host_pages(kv_pages)
        pages = self._pad([p for p, _ in pairs])
        slots = [s for _, s in pairs]
        n = len(pairs)
        data = jax.device_get(self._gather(kv_pages, pages))
        for h, (dk, dv) in zip(host, data):
            h[0][:, slots] = dk[:, :n]
            h[1][:, slots] = dv[:, :n]

    def swap_in(self, kv_pages, pairs: list[tuple[int, int]]):
        """Copies host slots back into device pages; returns the new pool."""
        if not pairs:
            return kv_pages
        host = self._host_pages(kv_pages)
        pages = self._pad([p for p, _ in pairs])
        slots = np.zeros(len(pages), np.int64)
        slots[:len(pairs)] = [s for _, s in pairs]
        # Padding rows read host slot 0 and land in the null page.
        data = [(h[0][:, slots], h[1][:, slots]) for h in host]
        return self._scatter(kv_pages, pages, data)

    def apply(self, kv_pages, out):
        """Runs a step's page moves in the order the scheduler assumes:
        swap out, then swap in."""
        self.swap_out(kv_pages, out.blocks_to_swap_out)
        return self.swap_in(kv_pages, out.blocks_to_swap_in)

    def warm_up(self, kv_pages, swap: bool):
        """Compiles the swap programs for every bucket when ``swap``;
        returns (the pool, programs compiled)."""
        n = 0
        if swap and self.num_host_pages:
            for size in self.ladder:
                self.swap_out(kv_pages, [(0, 0)] * size)
                kv_pages = self.swap_in(kv_pages, [(0, 0)] * size)
                n += 2
        return kv_pages, n
