"""`EncoderCacheManager`: which image holds which slot of the device's
encoder-output cache, and how many of a request's tokens can run given the
free slots (vLLM V1's encoder budget). No JAX here.

An image is encoded in the step that schedules its first placeholder not
yet computed, into a free slot; the slot stays the image's while its
placeholders run (chunked prefill may split them over steps) and is freed
once the last of them is scheduled, or when the request leaves the batch
(finished, aborted, preempted). A chunk that would reach an image no slot
is free for stops before that image; the request goes on next step.

Slot 0 is the null slot (padding rows of an encoder batch write there).
The pool holds one step's worth of images (``cdiv(max_num_batched_tokens,
tokens_per_image)``, plus one an image may straddle into the next step),
so slots never limit a step more than its token budget does by much.
"""

from __future__ import annotations

import collections

from ..request import Request

NULL_SLOT = 0


def encoder_cache_slots(max_num_batched_tokens: int,
                        tokens_per_image: int) -> int:
    """Slots of the cache, the null slot included."""
    return 2 + -(-max_num_batched_tokens // tokens_per_image)


class EncoderCacheManager:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = collections.deque(range(1, num_slots))
        # request id -> {index into its mm_inputs: slot}
        self.slots: dict[str, dict[int, int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def plan(self, req: Request, start: int, num_new: int
             ) -> tuple[int, list[int]]:
        """How many of ``num_new`` tokens from ``start`` can run, and the
        images among them to encode (indices into ``req.mm_inputs``).
        Changes nothing: ``commit`` takes the slots once the step has
        room for the tokens."""
        if not req.mm_inputs:
            return num_new, []
        held = self.slots.get(req.request_id, {})
        free = len(self._free)
        end = start + num_new
        need: list[int] = []
        for i, item in enumerate(req.mm_inputs):
            if item.offset >= end:
                break
            if item.end <= start or i in held:
                continue  # computed already, or encoded and waiting
            if not free:  # stop before this image
                return max(item.offset - start, 0), need
            need.append(i)
            free -= 1
        return num_new, need

    def commit(self, req: Request, items: list[int]
               ) -> list[tuple[str, int, int]]:
        """Takes a slot for each image; the (request_id, index, slot)
        triples the runner encodes before the step."""
        held = self.slots.setdefault(req.request_id, {})
        out = []
        for i in items:
            slot = self._free.popleft()
            held[i] = slot
            out.append((req.request_id, i, slot))
        return out

    def free_consumed(self, req: Request) -> None:
        """Frees the slots of images whose placeholders are all scheduled
        (the step reading them is enqueued before any later encoder write
        to the slot, on the same device stream)."""
        held = self.slots.get(req.request_id)
        if not held:
            return
        for i in [i for i in held
                  if req.mm_inputs[i].end <= req.num_computed_tokens]:
            self._free.append(held.pop(i))
        if not held:
            del self.slots[req.request_id]

    def free(self, request_id: str) -> None:
        for slot in self.slots.pop(request_id, {}).values():
            self._free.append(slot)
