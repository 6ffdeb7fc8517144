"""`SlotTable`: which adapter each of the ``max_loras`` device slots holds.

Slots count from 1 (slot 0 is "no adapter"). A step asks for the adapters
of its rows; those already in a slot stay, the others take a free slot or
the least recently used slot no row of this step needs. The scheduler
keeps the adapters of all running requests within ``max_loras``, so a
step's adapters always fit. Pure Python; the runner copies the weights.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable


class SlotTable:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._slot_of: collections.OrderedDict[Hashable, int] = \
            collections.OrderedDict()  # least recently used first
        self._free = list(range(num_slots, 0, -1))  # pop() gives slot 1 first

    def slot_of(self, key: Hashable) -> int | None:
        return self._slot_of.get(key)

    def assign(self, keys: Iterable[Hashable]
               ) -> tuple[dict[Hashable, int], list[tuple[int, Hashable]]]:
        """(slot of each key, the (slot, key) loads to make first)."""
        needed = list(dict.fromkeys(keys))
        if len(needed) > self.num_slots:
            raise RuntimeError(
                f"{len(needed)} adapters in one step, {self.num_slots} slots: "
                "the scheduler should have kept them within max_loras")
        for key in needed:
            if key in self._slot_of:
                self._slot_of.move_to_end(key)
        wanted = set(needed)
        loads = []
        for key in needed:
            if key in self._slot_of:
                continue
            if self._free:
                slot = self._free.pop()
            else:
                victim = next(k for k in self._slot_of if k not in wanted)
                slot = self._slot_of.pop(victim)
            self._slot_of[key] = slot
            loads.append((slot, key))
        return {key: self._slot_of[key] for key in needed}, loads
