"""Tokenizers through HF transformers: from a model folder, or rebuilt from a
GGUF file's metadata (vocab, merges, special tokens and chat template)."""

from __future__ import annotations

import functools
import logging
import os

from jaxinfer.models import TokenizerSource

from .gguf_tokenizer import byte_level_bpe_tokenizer

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def load_tokenizer(source: TokenizerSource):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # GGUF conversion prints progress bars
    try:
        if source.gguf_file is not None:
            path = os.path.join(source.directory, source.gguf_file)
            tok = byte_level_bpe_tokenizer(path)
            if tok is None:  # not byte-level BPE: transformers (needs torch)
                tok = AutoTokenizer.from_pretrained(
                    source.directory, gguf_file=source.gguf_file,
                    local_files_only=True)
        else:
            tok = AutoTokenizer.from_pretrained(source.directory,
                                                local_files_only=True)
    except (OSError, ValueError, ImportError) as e:
        where = os.path.join(source.directory, source.gguf_file or "")
        raise ValueError(f"could not load a tokenizer from {where}: {e}") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    return tok
