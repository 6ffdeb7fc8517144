"""`SlotLayout`: one device slot's adapter weights as one flat buffer.

A loaded adapter is kept on the host already in this layout (every target
layer of the model, in order, A then B, rank padded to ``max_lora_rank``,
the PEFT scaling folded into B; layers the adapter leaves alone are zeros),
so putting it in a slot is one host->device copy of one array and one
jitted in-place update with a fixed shape: no adapter ever compiles a new
program, and nothing is reshaped on the host while the engine waits.
"""

from __future__ import annotations

import dataclasses
import math

from jaxinfer.models.lora import LoRATarget


@dataclasses.dataclass(frozen=True)
class Span:
    """Where one target layer's A and B sit in the flat buffer."""
    target: LoRATarget
    a_offset: int
    a_shape: tuple[int, ...]  # in_shape + (rank,)
    b_offset: int
    b_shape: tuple[int, ...]  # (rank,) + out_shape


class SlotLayout:
    def __init__(self, targets: dict[str, LoRATarget], rank: int):
        self.targets = targets
        self.rank = rank
        spans, at = {}, 0
        for name, t in targets.items():
            a_shape = t.in_shape + (rank,)
            b_shape = (rank,) + t.out_shape
            spans[name] = Span(t, at, a_shape, at + math.prod(a_shape), b_shape)
            at += math.prod(a_shape) + math.prod(b_shape)
        self.spans = spans
        self.size = at  # elements of one slot

    @property
    def short_names(self) -> set[str]:
        """The module names PEFT's target_modules may list (q_proj, ...)."""
        return {t.short_name for t in self.targets.values()}
