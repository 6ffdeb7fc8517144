"""`KVCacheManager`: which pages each request owns (its block table)."""

from __future__ import annotations

from ..request import Request
from .block_pool import BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}

    @property
    def usage(self) -> float:
        return self.pool.usage

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Makes room for ``num_new_tokens`` more tokens of ``request``'s K/V.
        Returns the request's whole block table, or None (and allocates
        nothing) when too few pages are free."""
        table = self.block_tables.setdefault(request.request_id, [])
        needed = cdiv(request.num_computed_tokens + num_new_tokens,
                      self.block_size) - len(table)
        if needed > self.pool.num_free:
            return None
        if needed > 0:
            table.extend(self.pool.allocate(needed))
        return table

    def free(self, request: Request) -> None:
        table = self.block_tables.pop(request.request_id, [])
        # Free the tail first so the prefix stays cached longest.
        self.pool.free(reversed(table))
