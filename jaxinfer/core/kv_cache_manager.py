"""`KVCacheManager`: which pages each request owns (its block table), prefix
caching over them, and host swap slots.

Every page id a block table holds is one reference in the `BlockPool`; the
same page may sit in several tables (a shared prefix, the samples of an
n > 1 request among them), and a shared page is full, so never written. A
table covers positions ``[0, len(table) * block_size)``.

Prefix caching: once a block of ``block_size`` tokens is full (its tokens
scheduled), its page is registered under a hash that chains over the whole
prefix (`hash_block`). A new request looks its full blocks up in order and
takes every hit without computing it; the last prompt token is always
computed (its logits are needed), so the lookup stops one token short.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

from ..request import Request
from .block_pool import BlockHash, BlockPool, hash_block


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class HostPool:
    """Slots of the host swap space; a plain free list."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = collections.deque(range(num_slots))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} host slots, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        self._used.update(out)
        return out

    def free(self, slots: Iterable[int]) -> None:
        for s in slots:
            if s not in self._used:
                raise RuntimeError(f"double free of host slot {s}")
            self._used.remove(s)
            self._free.append(s)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int,
                 enable_caching: bool = True, num_host_blocks: int = 0):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.host = HostPool(num_host_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.host_tables: dict[str, list[int]] = {}  # swapped-out requests
        # Leading full blocks of each request already registered in the cache.
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up, in tokens
        self.prefix_cache_hits = 0  # of which found in the cache

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / max(1, self.prefix_cache_queries)

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # -- hashing and lookup -------------------------------------------------

    def block_hashes(self, req: Request) -> list[BlockHash]:
        """The request's chain of full-block hashes, extended to its current
        tokens (kept on the request; tokens only ever get appended)."""
        hashes = req.block_hashes
        B = self.block_size
        n_full = req.num_tokens // B
        if len(hashes) < n_full:
            tokens = req.all_token_ids
            for i in range(len(hashes), n_full):
                hashes.append(hash_block(hashes[-1] if hashes else None,
                                         tokens[i * B:(i + 1) * B],
                                         req.block_extra_keys(i * B,
                                                              (i + 1) * B)))
        return hashes

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Cached pages holding a prefix of a request that has no pages yet,
        and how many tokens they cover. Takes no references."""
        if not self.enable_caching or req.request_id in self.block_tables:
            return [], 0
        if req.skip_prefix_cache:
            # As vLLM: prompt logprobs (and pooling over every token) need
            # every prompt position, so such a request computes its whole
            # prompt (no cache hits).
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        pages = []
        for h in self.block_hashes(req)[:max_blocks]:
            page = self.pool.lookup(h)
            if page is None:
                break
            pages.append(page)
        return pages, len(pages) * self.block_size

    def record_query(self, num_tokens: int, num_hits: int) -> None:
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hits

    # -- allocation -------------------------------------------------------

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       computed_pages: Sequence[int] = ()) -> bool:
        """Makes room for ``num_new_tokens`` more tokens of ``req`` after its
        ``num_computed_tokens`` (plus ``computed_pages``, prefix-cache hits of
        a request with no pages yet). All or nothing: returns False, changing
        nothing, when too few pages are free. Shared pages (prefix-cache
        hits) are full and never written: the last prompt token is always
        computed, in a page of the request's own."""
        rid = req.request_id
        B = self.block_size
        table = self.block_tables.get(rid, [])
        if computed_pages and table:
            raise RuntimeError(f"request {rid} already has pages")
        start = req.num_computed_tokens + len(computed_pages) * B
        end = start + num_new_tokens
        n_have = len(table) + len(computed_pages)
        needed = max(0, cdiv(end, B) - n_have)
        reusable = sum(1 for p in computed_pages if self.pool.ref_cnt[p] == 0)
        if needed > self.pool.num_free - reusable:
            return False
        self.pool.touch(computed_pages)
        table = self.block_tables.setdefault(rid, [])
        table.extend(computed_pages)
        if computed_pages:
            self._num_cached_blocks[rid] = len(computed_pages)
        if needed:
            table.extend(self.pool.allocate(needed))
        self._cache_full_blocks(req, end)
        return True

    def _cache_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Registers the request's blocks that are full once ``num_tokens``
        of it are computed."""
        if not self.enable_caching:
            return
        rid = req.request_id
        done = self._num_cached_blocks.get(rid, 0)
        # Only blocks whose tokens are all known: a pending token (still on
        # the device) cannot be hashed yet; its block is registered by a
        # later step.
        n_full = min(num_tokens, req.num_tokens) // self.block_size
        if n_full <= done:
            return
        hashes = self.block_hashes(req)
        table = self.block_tables[rid]
        for i in range(done, n_full):
            if self.pool.page_hash[table[i]] is None:
                self.pool.cache_page(table[i], hashes[i])
        self._num_cached_blocks[rid] = n_full

    def trim(self, req: Request) -> None:
        """Gives back the pages (or host slots) past the request's
        ``num_computed_tokens`` (rejected draft tokens' slots). They are the request's own, fresh
        pages: drafts sit past every known token, so none of them holds a
        registered full block."""
        keep = cdiv(req.num_computed_tokens, self.block_size)
        table = self.block_tables.get(req.request_id)
        if table is not None and len(table) > keep:
            self.pool.free(reversed(table[keep:]))
            del table[keep:]
        # Swapped out while its drafts were verified (a step scheduled
        # ahead): the host slots past them.
        slots = self.host_tables.get(req.request_id)
        if slots is not None and len(slots) > keep:
            self.host.free(slots[keep:])
            del slots[keep:]

    def free(self, req: Request) -> None:
        """Releases everything the request holds (pages and host slots)."""
        rid = req.request_id
        table = self.block_tables.pop(rid, [])
        self._num_cached_blocks.pop(rid, None)
        # Free the tail first so the prefix stays cached longest.
        self.pool.free(reversed(table))
        self.host.free(self.host_tables.pop(rid, []))

    # -- swapping ---------------------------------------------------------

    def swap_out(self, req: Request) -> list[tuple[int, int]] | None:
        """Moves the request's pages to host slots; returns the
        ``(device_page, host_slot)`` copies for the runner, or None when the
        host space is short (nothing changes then)."""
        rid = req.request_id
        table = self.block_tables.get(rid, [])
        if len(table) > self.host.num_free:
            return None
        slots = self.host.allocate(len(table))
        self.host_tables[rid] = slots
        del self.block_tables[rid]
        self._num_cached_blocks.pop(rid, None)
        self.pool.free(reversed(table))
        return list(zip(table, slots))

    def swap_in(self, req: Request, num_new_tokens: int
                ) -> list[tuple[int, int]] | None:
        """Brings a swapped-out request back to fresh pages with room for
        ``num_new_tokens`` more; returns the ``(device_page, host_slot)``
        copies, or None when too few pages are free."""
        rid = req.request_id
        slots = self.host_tables[rid]
        need = cdiv(req.num_computed_tokens + num_new_tokens, self.block_size)
        if max(need, len(slots)) > self.pool.num_free:
            return None
        pages = self.pool.allocate(len(slots))
        self.block_tables[rid] = pages
        del self.host_tables[rid]
        self.host.free(slots)
        # The swapped-in full blocks are registered in the cache again.
        self.allocate_slots(req, num_new_tokens)
        return list(zip(pages, slots))
