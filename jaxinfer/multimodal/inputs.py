"""`MultiModalInput`: one image of a request, as the scheduler and the
runner see it (vLLM's placeholder range plus the item's data and hash)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class MultiModalInput:
    """An image after preprocessing, and where its embeddings go."""
    pixel_values: np.ndarray  # [C, S, S] float32, the image processor's output
    hash: str  # sha256 of the image's mode, size and pixel bytes (prefix-cache key)
    offset: int  # position of its first placeholder token in the prompt
    length: int  # placeholder tokens = rows of the encoder's output

    @property
    def end(self) -> int:
        return self.offset + self.length
