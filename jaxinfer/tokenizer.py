"""Tokenizers through HF transformers: from a model folder, or rebuilt from a
GGUF file's metadata (vocab, merges, special tokens and chat template).

A GGUF tokenizer is rebuilt once per file: its fast form (``tokenizer.json``
and its config) is saved into the file's weight-cache entry
(``models/weight_cache.py``) and later starts load that, without parsing the
GGUF's vocabulary again, and through `tokenizers` alone until something
needs transformers (``fast_tokenizer.py``). A model folder's plain fast
tokenizer is served the same way once transformers has been seen to load
it as one (`_from_model_folder`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from jaxinfer.models.tokenizer_source import TokenizerSource
from jaxinfer.models.weight_cache import cache_root, file_digest

from .fast_tokenizer import (
    CONFIG_FILE,
    PLAIN_CLASSES,
    TOKENIZER_FILE,
    LazyFastTokenizer,
    decodes_as_backend,
    serves_fast,
)

logger = logging.getLogger(__name__)

# A transformers tokenizer, or a `LazyFastTokenizer` standing in for one.
Tokenizer = Any

# Inside a weight-cache entry; renamed into place once fully written.
CACHED_TOKENIZER_DIR = "tokenizer"


@functools.lru_cache(maxsize=8)
def load_tokenizer(source: TokenizerSource) -> Tokenizer:
    try:
        if source.gguf_file is None:
            return _from_model_folder(source.directory)
        cached = (os.path.join(source.cache_dir, CACHED_TOKENIZER_DIR)
                  if source.cache_dir else None)
        if cached and os.path.isdir(cached):
            try:
                return _from_cache(cached)
            except Exception as e:  # noqa: BLE001 - whatever a damaged file raises
                logger.warning("the cached tokenizer in %s is unreadable (%s); "
                               "rebuilding it from the GGUF file", cached, e)
                shutil.rmtree(cached, ignore_errors=True)
        tok = _quietly(_from_gguf, source.directory, source.gguf_file)
        if cached:
            _save(tok, cached)
        return tok
    except (OSError, ValueError, ImportError) as e:
        where = os.path.join(source.directory, source.gguf_file or "")
        raise ValueError(f"could not load a tokenizer from {where}: {e}") from e


def _quietly(load: Callable[..., Tokenizer], *args: Any) -> Tokenizer:
    """``load(*args)`` with transformers' logging at errors only (its GGUF
    conversion prints progress bars)."""
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return load(*args)
    finally:
        hf_logging.set_verbosity(verbosity)


def _from_folder(directory: str) -> Tokenizer:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _from_cache(directory: str) -> Tokenizer:
    """A tokenizer saved by ``_save``. Ours (byte-level BPE) are served by
    `tokenizers` until something needs transformers (fast_tokenizer.py):
    importing it is most of a warm start's tokenizer time, and AutoTokenizer
    would also import the config machinery, which imports torch."""
    if serves_fast(directory):
        return LazyFastTokenizer(directory)
    return _quietly(_from_folder, directory)


# Under the weight cache's root: one empty file per model folder whose
# tokenizer transformers loads as a plain fast tokenizer, named by a digest
# of what that choice depends on.
PLAIN_VERDICTS_DIR = "plain-tokenizers"


def _from_model_folder(directory: str) -> Tokenizer:
    """A model folder's tokenizer: transformers' AutoTokenizer the first
    time, and from then on, if that gave a plain fast tokenizer, the same
    served by `tokenizers` alone (fast_tokenizer.py): importing transformers
    (and torch through it) would be most of a warm start's time
    (docs/performance.md, "Building the step programs"). Which class
    AutoTokenizer picks depends on config.json's model type as well as the tokenizer's
    own config (transformers 5 gives a Qwen2 folder Qwen2Tokenizer, whose
    pre-tokenizer is not the one in tokenizer.json), so the fast path is
    taken only where transformers itself was seen to choose the plain
    class, for these exact files and this transformers version."""
    if not serves_fast(directory, clean_up_checked=True):
        return _quietly(_from_folder, directory)
    verdict = _plain_verdict_path(directory)
    if verdict is not None and os.path.isfile(verdict):
        return LazyFastTokenizer(directory)
    tok = _quietly(_from_folder, directory)
    if (verdict is not None and type(tok).__name__ in PLAIN_CLASSES
            and _quietly(decodes_as_backend, tok)):
        try:
            os.makedirs(os.path.dirname(verdict), exist_ok=True)
            with open(verdict, "w"):
                pass
        except OSError as e:  # a read-only cache only costs the next start
            logger.warning("could not record %s's tokenizer class in %s: %s",
                           directory, verdict, e)
    return tok


def _plain_verdict_path(directory: str) -> str | None:
    """Where the verdict on ``directory``'s tokenizer lives: keyed by the
    tokenizer's files, config.json and transformers' version; None when
    the weight cache is off."""
    root = cache_root()
    if root is None:
        return None
    import importlib.metadata
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    h = hashlib.sha256(version.encode())
    for name in (CONFIG_FILE, TOKENIZER_FILE, "config.json"):
        path = os.path.join(directory, name)
        h.update(name.encode())
        if os.path.isfile(path):
            h.update(file_digest(path).encode())
    return os.path.join(root, PLAIN_VERDICTS_DIR, h.hexdigest()[:32])


def _from_gguf(directory: str, gguf_file: str) -> Tokenizer:
    # The GGUF reader pulls in the model registry: only when parsing one.
    from .gguf_tokenizer import byte_level_bpe_tokenizer
    tok = byte_level_bpe_tokenizer(os.path.join(directory, gguf_file))
    if tok is None:  # not byte-level BPE: transformers (needs torch)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(
            directory, gguf_file=gguf_file, local_files_only=True)
    return tok


def _save(tok: Tokenizer, target: str) -> None:
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
