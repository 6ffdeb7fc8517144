"""Tokenizers through HF transformers: from a model folder, or rebuilt from a
GGUF file's metadata (vocab, merges, special tokens and chat template).

A GGUF tokenizer is rebuilt once per file: its fast form (``tokenizer.json``
and its config) is saved into the file's weight-cache entry
(``models/weight_cache.py``) and later starts load that, without parsing the
GGUF's vocabulary again.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile

from jaxinfer.models import TokenizerSource

from .gguf_tokenizer import byte_level_bpe_tokenizer

logger = logging.getLogger(__name__)

# Inside a weight-cache entry; renamed into place once fully written.
CACHED_TOKENIZER_DIR = "tokenizer"


@functools.lru_cache(maxsize=8)
def load_tokenizer(source: TokenizerSource):
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # GGUF conversion prints progress bars
    try:
        if source.gguf_file is None:
            return _from_folder(source.directory)
        cached = (os.path.join(source.cache_dir, CACHED_TOKENIZER_DIR)
                  if source.cache_dir else None)
        if cached and os.path.isdir(cached):
            try:
                return _from_cache(cached)
            except Exception as e:  # whatever a damaged file raises
                logger.warning("the cached tokenizer in %s is unreadable (%s); "
                               "rebuilding it from the GGUF file", cached, e)
                shutil.rmtree(cached, ignore_errors=True)
        tok = _from_gguf(source)
        if cached:
            _save(tok, cached)
        return tok
    except (OSError, ValueError, ImportError) as e:
        where = os.path.join(source.directory, source.gguf_file or "")
        raise ValueError(f"could not load a tokenizer from {where}: {e}") from e
    finally:
        hf_logging.set_verbosity(verbosity)


def _from_folder(directory: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _from_cache(directory: str):
    """A tokenizer saved by ``_save``. Ours (byte-level BPE) load as a plain
    fast tokenizer: AutoTokenizer would first import the config machinery,
    which imports torch, for nothing."""
    import json
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        cls = json.load(f).get("tokenizer_class")
    if cls in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast.from_pretrained(directory,
                                                       local_files_only=True)
    return _from_folder(directory)


def _from_gguf(source: TokenizerSource):
    path = os.path.join(source.directory, source.gguf_file)
    tok = byte_level_bpe_tokenizer(path)
    if tok is None:  # not byte-level BPE: transformers (needs torch)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(
            source.directory, gguf_file=source.gguf_file, local_files_only=True)
    return tok


def _save(tok, target: str) -> None:
    """Saves into a temporary folder renamed into place, so a reader never
    sees half a tokenizer; a failure only costs the next start a rebuild."""
    parent = os.path.dirname(target)
    try:
        tmp = tempfile.mkdtemp(prefix=".tokenizer-", dir=parent)
        try:
            tok.save_pretrained(tmp)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:  # read-only cache, or another process was first
        if not os.path.isdir(target):
            logger.warning("could not cache the tokenizer in %s: %s", target, e)
