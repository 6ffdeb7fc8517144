"""`EncoderRunner`: a step's images through the model's encoder, on device,
and the index that puts their embeddings in place of the placeholders.

The encoder outputs live in one device buffer, ``[slots, tokens_per_image,
D]`` in the model dtype (the scheduler's `EncoderCacheManager` decides
which image holds which slot). Before a step, the images the scheduler
named (``SchedulerOutput.encoder_inputs``) are encoded in one jitted call,
batched across requests and padded to a power-of-two count of images
(padding writes the null slot), writing their slots in place (the buffer
is donated). The step then receives the buffer and ``mm_index`` [T]: for
each token row, the flat row of the buffer holding its embedding, -1 for a
text token (``models.runtime.merge_encoder_outputs``). A step without
image tokens passes none, and runs the text program.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models.runtime import encode_images

from ..core.encoder_cache_manager import NULL_SLOT
from ..core.scheduler_output import SchedulerOutput
from .buckets import _pow2_ladder, _round_up


def _encode(model, params, cache, pixel_values, slots):
    """Writes the images' embeddings into their slots of the cache."""
    out = encode_images(model, params, pixel_values)
    return cache.at[slots].set(out.astype(cache.dtype))


class EncoderRunner:
    def __init__(self, model, image_input, num_slots: int, hidden_size: int,
                 num_channels: int, dtype, replicated):
        self.tokens_per_image = image_input.tokens_per_image
        self.pixel_shape = (num_channels, image_input.image_size,
                            image_input.image_size)
        self.num_slots = num_slots
        shape = (num_slots, self.tokens_per_image, hidden_size)
        self.cache = jax.jit(lambda: jnp.zeros(shape, dtype),
                             out_shardings=replicated)()
        # Images per encoder call: at most every slot but the null one.
        self.batch_sizes = _pow2_ladder(1, num_slots - 1)
        self._encode = jax.jit(functools.partial(_encode, model),
                               donate_argnums=(1,))
        # request id -> {index into its mm_inputs: slot}, for images whose
        # placeholders are not all computed yet.
        self.slots: dict[str, dict[int, int]] = {}
        self.images_encoded = 0
        self.encoder_calls = 0
        # Benchmarks: wait for each encoder call and add up its seconds
        # (meaningful with async_scheduling off, when nothing else runs).
        self.sync_timing = False
        self.encoder_seconds = 0.0

    @property
    def nbytes(self) -> int:
        return self.cache.size * self.cache.dtype.itemsize

    def release(self, request_ids) -> None:
        """Forgets requests that left the batch (their slots are free)."""
        for rid in request_ids:
            self.slots.pop(rid, None)

    def encode(self, params, out: SchedulerOutput, requests: dict) -> None:
        """Runs the encoder over the step's new images."""
        items = out.encoder_inputs
        biggest = self.batch_sizes[-1]
        for at in range(0, len(items), biggest):
            chunk = items[at:at + biggest]
            B = _round_up(len(chunk), self.batch_sizes)
            pixels = np.zeros((B, *self.pixel_shape), np.float32)
            slots = np.full(B, NULL_SLOT, np.int32)
            for b, (rid, index, slot) in enumerate(chunk):
                pixels[b] = requests[rid].mm_inputs[index].pixel_values
                slots[b] = slot
                self.slots.setdefault(rid, {})[index] = slot
            t0 = time.perf_counter()
            self.cache = self._encode(params, self.cache, pixels, slots)
            if self.sync_timing:
                jax.block_until_ready(self.cache)
                self.encoder_seconds += time.perf_counter() - t0
            self.images_encoded += len(chunk)
            self.encoder_calls += 1

    def step_inputs(self, sched, requests: dict, cu_q_lens, num_rows: int):
        """(cache, mm_index [num_rows]) for a step whose rows hold image
        placeholders, else None. Images whose last placeholder is in this
        step are forgotten after it (the scheduler frees their slots)."""
        if not self.slots:
            return None
        N = self.tokens_per_image
        index = None
        for r, s in enumerate(sched):
            held = self.slots.get(s.request_id)
            if not held:
                continue
            start = s.start_pos
            end = start + len(s.token_ids)
            for i, item in enumerate(requests[s.request_id].mm_inputs):
                if item.offset >= end:
                    break
                if item.end <= start:
                    continue
                slot = held.get(i)
                if slot is None:
                    raise RuntimeError(
                        f"request {s.request_id}: image {i}'s placeholders "
                        "are scheduled but it was never encoded")
                lo, hi = max(start, item.offset), min(end, item.end)
                if index is None:
                    index = np.full(num_rows, -1, np.int32)
                row = cu_q_lens[r] + lo - start
                index[row:row + hi - lo] = slot * N + np.arange(
                    lo - item.offset, hi - item.offset, dtype=np.int32)
                if hi == item.end:
                    del held[i]
            if not held:
                del self.slots[s.request_id]
        return None if index is None else (self.cache, index)

    def warm_up(self, params) -> int:
        """Compiles the encoder for every batch size; returns how many."""
        for B in self.batch_sizes:
            pixels = np.zeros((B, *self.pixel_shape), np.float32)
            slots = np.full(B, NULL_SLOT, np.int32)
            self.cache = self._encode(params, self.cache, pixels, slots)
        jax.block_until_ready(self.cache)
        return len(self.batch_sizes)
