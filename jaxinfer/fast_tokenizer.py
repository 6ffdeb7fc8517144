"""A saved fast tokenizer served by `tokenizers` alone on the hot paths.

Importing transformers takes 1.1-1.6 s on a 2-core machine (its hub client
pulls in httpx and trio), longer than the rest of a warm `jaxinfer generate`
start. What a request needs from a tokenizer (encode, decode, the EOS id,
the backend that incremental detokenization steps) is the `tokenizers`
object itself, so `LazyFastTokenizer` answers those directly and builds
transformers' `PreTrainedTokenizerFast` from the same folder only when
something else is asked for (a chat template, ``save_pretrained``,
``convert_ids_to_tokens``...): every other attribute is the HF object's own,
so nothing behaves differently, it only arrives later.

Only folders whose config says the backend tokenizer is the whole story are
taken (a `PreTrainedTokenizerFast` / `TokenizersBackend` class, no clean-up
of decoded spaces): the ones ``tokenizer.py`` saves for GGUF files.
"""

from __future__ import annotations

import json
import os
import threading

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
_PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an
    AddedToken's dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def serves_fast(directory: str) -> bool:
    """Whether ``directory``'s tokenizer can be served by `tokenizers` alone
    (see the module's docstring)."""
    try:
        with open(os.path.join(directory, CONFIG_FILE)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict)
            and config.get("tokenizer_class") in _PLAIN_CLASSES
            and config.get("clean_up_tokenization_spaces") is False
            and os.path.isfile(os.path.join(directory, TOKENIZER_FILE)))


class LazyFastTokenizer:
    """encode / decode / eos_token_id / backend_tokenizer / chat_template
    from `tokenizers`; anything else from a `PreTrainedTokenizerFast` made
    on first use."""

    def __init__(self, directory: str):
        from tokenizers import Tokenizer
        self.name_or_path = directory
        with open(os.path.join(directory, CONFIG_FILE)) as f:
            self._config = json.load(f)
        self.backend_tokenizer = Tokenizer.from_file(
            os.path.join(directory, TOKENIZER_FILE))
        self.eos_token_id = self._special_id("eos_token")
        self.bos_token_id = self._special_id("bos_token")
        self.pad_token_id = self._special_id("pad_token")
        self.chat_template = self._config.get("chat_template")
        template = os.path.join(directory, "chat_template.jinja")
        if self.chat_template is None and os.path.isfile(template):
            with open(template) as f:
                self.chat_template = f.read()
        self._full = None
        self._lock = threading.Lock()

    def _special_id(self, key: str) -> int | None:
        text = _token_text(self._config.get(key))
        return None if text is None else self.backend_tokenizer.token_to_id(text)

    # -- the hot paths ------------------------------------------------------

    def encode(self, text, add_special_tokens: bool = True, **kwargs):
        if kwargs or not isinstance(text, str):
            return self.full.encode(text, add_special_tokens=add_special_tokens,
                                    **kwargs)
        return self.backend_tokenizer.encode(
            text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = False, **kwargs):
        if kwargs:
            return self.full.decode(token_ids,
                                    skip_special_tokens=skip_special_tokens,
                                    **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.backend_tokenizer.decode(
            [int(t) for t in token_ids], skip_special_tokens=skip_special_tokens)

    # -- everything else: transformers' own object --------------------------

    @property
    def full(self):
        """The `PreTrainedTokenizerFast` of the same folder (made once)."""
        with self._lock:
            if self._full is None:
                from transformers import PreTrainedTokenizerFast
                self._full = PreTrainedTokenizerFast.from_pretrained(
                    self.name_or_path, local_files_only=True)
            return self._full

    def __getattr__(self, name: str):
        # Only reached for names not set above; private names (pickle's and
        # copy's probes among them) are not forwarded.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full, name)

    def __len__(self) -> int:
        return len(self.full)

    def __call__(self, *args, **kwargs):
        return self.full(*args, **kwargs)

    def __reduce__(self):
        return (LazyFastTokenizer, (self.name_or_path,))

    def __repr__(self) -> str:
        return f"LazyFastTokenizer({self.name_or_path!r})"
