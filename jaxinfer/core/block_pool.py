"""`BlockPool`: the KV pages of the device pool, as ids, ref counts and hashes.

Page 0 is the null page (padding) and is never handed out. A page with no
holders is free. Free pages wait in two queues:

- plain free pages (no reusable content), handed out first;
- cached free pages: full pages whose block hash is still registered, so a
  later request with the same prefix can take them back (a prefix-cache hit).
  They are evicted, least recently freed first, only when no plain page is
  left.

``free`` appends to the back of a queue, so callers pass a request's pages
tail first: the deepest blocks of a prefix are evicted before its root.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import NamedTuple

NULL_PAGE = 0


class BlockHash(NamedTuple):
    """Identity of one full block of tokens in its prefix. ``value`` chains
    the parent's; ``token_ids`` and ``extra_keys`` are kept so that a lookup
    compares content, not just a 64-bit hash."""
    value: int  # hash((parent value, token_ids, extra_keys))
    token_ids: tuple[int, ...]  # the block_size tokens of this block
    extra_keys: tuple | None  # LoRA id, multimodal input hashes, cache salt ...


def hash_block(parent: BlockHash | None, token_ids: Iterable[int],
               extra_keys: tuple | None = None) -> BlockHash:
    toks = tuple(token_ids)
    parent_value = parent.value if parent is not None else 0
    return BlockHash(hash((parent_value, toks, extra_keys)), toks, extra_keys)


class NoFreePagesError(RuntimeError):
    """Raised when an allocation asks for more pages than are free; callers
    check ``num_free`` first, so this means a bookkeeping bug."""


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (page 0 is reserved), "
                             f"got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.page_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}  # hash -> the page holding it
        # OrderedDicts give O(1) removal from the middle, which prefix-cache
        # hits on a free page need.
        self._free_plain = collections.OrderedDict(
            (i, None) for i in range(1, num_blocks))
        self._free_cached: collections.OrderedDict[int, None] = \
            collections.OrderedDict()
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Pages an allocation may take (cached free pages included)."""
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_free_cached(self) -> int:
        return len(self._free_cached)

    @property
    def usage(self) -> float:
        """Share of usable pages held by requests."""
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def free_pages(self) -> list[int]:
        """Every free page (for invariant checks)."""
        return list(self._free_plain) + list(self._free_cached)

    # -- prefix cache -----------------------------------------------------

    def lookup(self, block_hash: BlockHash) -> int | None:
        return self.cached.get(block_hash)

    def cache_page(self, page: int, block_hash: BlockHash) -> bool:
        """Registers a full page under its block hash. Returns False (and
        registers nothing) when another page already holds that block."""
        if not self.enable_caching or block_hash in self.cached:
            return False
        if self.page_hash[page] is not None:
            raise RuntimeError(f"page {page} is already cached")
        self.page_hash[page] = block_hash
        self.cached[block_hash] = page
        return True

    def _uncache(self, page: int) -> None:
        h = self.page_hash[page]
        if h is not None:
            del self.cached[h]
            self.page_hash[page] = None

    def reset_prefix_cache(self) -> None:
        """Forgets every cached block that no request holds."""
        for page in list(self._free_cached):
            self._uncache(page)
            self._free_plain[page] = None
        self._free_cached.clear()

    # -- pages ------------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """Takes n pages: plain free pages first, then evicts cached ones
        (least recently freed first)."""
        if n > self.num_free:
            raise NoFreePagesError(f"asked for {n} pages, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free_plain:
                page, _ = self._free_plain.popitem(last=False)
            else:
                page, _ = self._free_cached.popitem(last=False)
                self._uncache(page)
                self.num_evictions += 1
            self.ref_cnt[page] = 1
            out.append(page)
        return out

    def touch(self, pages: Iterable[int]) -> None:
        """Takes one more reference on each page (sharing it); a free cached
        page leaves the free queue."""
        for page in pages:
            if self.ref_cnt[page] == 0:
                if page in self._free_cached:
                    del self._free_cached[page]
                else:
                    del self._free_plain[page]
            self.ref_cnt[page] += 1

    def free(self, pages: Iterable[int]) -> None:
        """Drops one reference from each page; pages reaching zero go to the
        back of their free queue. Pass pages in eviction order (tail first)."""
        for page in pages:
            if page == NULL_PAGE:
                continue
            if self.ref_cnt[page] <= 0:
                raise RuntimeError(f"double free of page {page}")
            self.ref_cnt[page] -= 1
            if self.ref_cnt[page] == 0:
                if self.page_hash[page] is not None:
                    self._free_cached[page] = None
                else:
                    self._free_plain[page] = None
