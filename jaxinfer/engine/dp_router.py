"""Which data-parallel replica takes a request.

Two goals pull apart: keep every replica busy, and send a prompt where its
prefix pages already are (a conversation's next turn repeats the whole
conversation so far; recomputing it elsewhere costs its prefill). The rule:

1. the replica holding the longest run of the prompt's leading full blocks
   (read from each replica's prefix cache, and from the router's memory of
   prompts routed but not yet scheduled), when that run covers at least
   ``min_share`` of the prompt's full blocks and that replica's load
   exceeds the least loaded one's by at most ``max_imbalance`` requests;
2. otherwise the least loaded replica (running + waiting requests), ties
   to the one given fewer requests so far, then the lowest index.

A short common prefix (a chat template's system prompt) covers little of a
long prompt and so does not pin every request to one replica; the
imbalance bound caps what any prefix can cost in queueing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from ..core.block_pool import BlockHash, hash_block

# Prompt block hashes remembered per router (routed, maybe not yet cached).
_MEMORY = 1 << 16


def prompt_block_hashes(token_ids: Sequence[int], block_size: int,
                        extra_keys: tuple | None = None) -> list[BlockHash]:
    """The chained hashes of the prompt's full blocks, as the replicas'
    prefix caches key them (``kv_cache_manager.block_hashes``)."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        hashes.append(hash_block(hashes[-1] if hashes else None,
                                 token_ids[start:start + block_size],
                                 extra_keys))
    return hashes


def leading_matches(hashes: list[BlockHash], has: Callable[[BlockHash], bool]
                    ) -> int:
    """How many of the leading ``hashes`` ``has`` holds, in order."""
    n = 0
    for h in hashes:
        if not has(h):
            break
        n += 1
    return n


class DataParallelRouter:
    def __init__(self, num_replicas: int, block_size: int,
                 max_imbalance: int, min_share: float = 0.5):
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.max_imbalance = max_imbalance
        self.min_share = min_share
        self.assigned = [0] * num_replicas  # requests routed to each, ever
        self._recent: collections.OrderedDict[BlockHash, int] = \
            collections.OrderedDict()

    def choose(self, token_ids: Sequence[int], loads: Sequence[int],
               cached: Sequence[Callable[[BlockHash], bool]]) -> int:
        """The replica for a prompt; ``loads[r]``: requests replica r holds
        now; ``cached[r](hash)``: whether r's prefix cache has that block."""
        hashes = prompt_block_hashes(token_ids, self.block_size)
        least = min(loads)
        best, best_blocks = -1, 0
        for r in range(self.num_replicas):
            def routed_here(h: BlockHash, r: int = r) -> bool:
                return self._recent.get(h) == r
            blocks = max(leading_matches(hashes, cached[r]),
                         leading_matches(hashes, routed_here))
            if blocks > best_blocks:
                best, best_blocks = r, blocks
        if (best >= 0 and best_blocks >= self.min_share * len(hashes)
                and loads[best] - least <= self.max_imbalance):
            choice = best
        else:
            choice = min(range(self.num_replicas),
                         key=lambda r: (loads[r], self.assigned[r], r))
        self._remember(hashes, choice)
        self.assigned[choice] += 1
        return choice

    def _remember(self, hashes: list[BlockHash], replica: int) -> None:
        for h in hashes:
            self._recent[h] = replica
            self._recent.move_to_end(h)
        while len(self._recent) > _MEMORY:
            self._recent.popitem(last=False)
