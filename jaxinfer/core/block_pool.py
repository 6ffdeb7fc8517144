"""`BlockPool`: the KV pages of the device pool, as ids and ref counts.

Page 0 is the null page (padding) and is never handed out. Free pages wait in
a queue; ``allocate`` takes from its front and ``free`` returns pages to its
back, so the queue is in least-recently-freed order (the order prefix-cache
eviction wants).
"""

from __future__ import annotations

import collections

NULL_PAGE = 0


class NoFreePagesError(RuntimeError):
    """Raised when an allocation asks for more pages than are free; callers
    check ``num_free`` first, so this means a bookkeeping bug."""


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (page 0 is reserved), "
                             f"got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        # An OrderedDict gives O(1) removal from the middle, which prefix-cache
        # hits on a free page need.
        self._free = collections.OrderedDict((i, None)
                                             for i in range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Share of usable pages held by requests."""
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise NoFreePagesError(f"asked for {n} pages, {len(self._free)} free")
        out = []
        for _ in range(n):
            page, _ = self._free.popitem(last=False)
            self.ref_cnt[page] = 1
            out.append(page)
        return out

    def touch(self, page: int) -> None:
        """Takes one more reference on a page (sharing it)."""
        if self.ref_cnt[page] == 0:
            del self._free[page]
        self.ref_cnt[page] += 1

    def free(self, pages) -> None:
        """Drops one reference from each page; pages reaching zero go to the
        back of the free queue. Pass pages in eviction order (last first)."""
        for page in pages:
            if page == NULL_PAGE:
                continue
            if self.ref_cnt[page] <= 0:
                raise RuntimeError(f"double free of page {page}")
            self.ref_cnt[page] -= 1
            if self.ref_cnt[page] == 0:
                self._free[page] = None
