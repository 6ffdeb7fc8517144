"""Whole-page copies between the KV pool and host memory: swap out and swap
in (preemption by swap). The scheduler decides them (pairs in `SchedulerOutput`); this
module moves the bytes, before the step that needs them.

Each kind is one jitted program per count bucket (a power of two), padded
with the null page, so swaps never compile at serving time once warmed up.
The pool is donated wherever it is written. Host pages live in NumPy arrays
(per layer one ``[K, num_host_pages, ...]`` array per device array: K, V,
and fp8 pages' scales), allocated on the first swap.
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from .buckets import _pow2_ladder, _round_up

logger = logging.getLogger(__name__)


def _gather(kv_pages, ids):
    """ids [n] -> per layer (k, v) each [K, n, B, H] (and fp8 pages'
    scales, each [K, n]: every array of a layer has pages on axis 1)."""
    return [tuple(a[:, ids] for a in layer) for layer in kv_pages]


def _scatter(kv_pages, ids, data):
    return [tuple(a.at[:, ids].set(d) for a, d in zip(layer, new))
            for layer, new in zip(kv_pages, data)]


class PageMover:
    def __init__(self, num_pages: int, num_host_pages: int):
        self.num_host_pages = num_host_pages
        self.ladder = _pow2_ladder(8, max(8, 1 << (num_pages - 1).bit_length()))
        self._gather = jax.jit(_gather)
        self._scatter = jax.jit(_scatter, donate_argnums=(0,))
        self._host: list[tuple[np.ndarray, ...]] | None = None

    def _pad(self, ids: list[int]) -> np.ndarray:
        out = np.zeros(_round_up(len(ids), self.ladder), np.int32)
        out[:len(ids)] = ids
        return out

    def _host_pages(self, kv_pages) -> list[tuple[np.ndarray, ...]]:
        """Per layer, one host array per device array of the layer (K, V,
        and fp8 pages' scales), pages on axis 1."""
        if self._host is None:
            self._host = [tuple(
                np.zeros((a.shape[0], self.num_host_pages) + a.shape[2:],
                         np.dtype(a.dtype)) for a in layer)
                for layer in kv_pages]
            logger.info("allocated %.2f GiB of host swap space",
                        sum(h.nbytes for layer in self._host for h in layer)
                        / 2**30)
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
        for layer, got in zip(host, data):
            for h, d in zip(layer, got):
                h[:, slots] = d[:, :n]

    def swap_in(self, kv_pages, pairs: list[tuple[int, int]]):
        """Copies host slots back into device pages; returns the new pool."""
        if not pairs:
            return kv_pages
        host = self._host_pages(kv_pages)
        pages = self._pad([p for p, _ in pairs])
        slots = np.zeros(len(pages), np.int64)
        slots[:len(pairs)] = [s for _, s in pairs]
        # Padding rows read host slot 0 and land in the null page.
        data = [tuple(h[:, slots] for h in layer) for layer in host]
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
