"""Where a model's tokenizer lives (free of JAX: an HTTP front end loads
the tokenizer from it without the engine)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TokenizerSource:
    """Where the tokenizer lives: an HF folder, or a GGUF file's metadata
    (``cache_dir``: the file's weight-cache entry, where the tokenizer's
    fast form is kept once built)."""
    directory: str
    gguf_file: str | None = None
    cache_dir: str | None = None
