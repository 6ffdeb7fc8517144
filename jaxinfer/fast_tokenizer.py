"""A saved fast tokenizer served by `tokenizers` alone on the hot paths.

Importing transformers is slow (its hub client pulls in httpx and trio),
slower than the rest of a warm `jaxinfer generate` start on a small CPU.
What a request needs from a tokenizer (encode, decode, the EOS id, the
backend that incremental detokenization steps) is the `tokenizers`
object itself, so `LazyFastTokenizer` answers those directly and builds
transformers' `PreTrainedTokenizerFast` from the same folder only when
something else is asked for (a chat template, ``save_pretrained``,
``convert_ids_to_tokens``...): every other attribute is the HF object's own,
so nothing behaves differently, it only arrives later. ``LLM.get_tokenizer()``
hands out that object itself (what vLLM users pass to transformers).

Only folders whose config says the backend tokenizer is the whole story are
taken (a `PreTrainedTokenizerFast` / `TokenizersBackend` class, no clean-up
of decoded spaces): the ones ``tokenizer.py`` saves for GGUF files, and model
folders where transformers was seen to choose that class and to decode as
the backend does (``tokenizer.py``'s verdict).
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Iterable
from typing import Any

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _token_text(value: str | dict | None) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an
    AddedToken's dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def serves_fast(directory: str, clean_up_checked: bool = False) -> bool:
    """Whether ``directory``'s tokenizer can be served by `tokenizers` alone
    (see the module's docstring). ``clean_up_checked``: the caller has seen
    that transformers' own decode of these files does not clean up spaces
    (`decodes_as_backend`), so a config asking for clean-up is taken too."""
    try:
        with open(os.path.join(directory, CONFIG_FILE)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict)
            and config.get("tokenizer_class") in PLAIN_CLASSES
            and (clean_up_checked
                 or config.get("clean_up_tokenization_spaces") is False)
            and os.path.isfile(os.path.join(directory, TOKENIZER_FILE)))


# Every pattern transformers' clean_up_tokenization rewrites (" ." -> "."
# and the rest), in text a byte-level BPE round-trips exactly.
CLEAN_UP_PROBE = "Yes , it is . Is it ? No ! I ' m sure : do n't 's 've 're ."


def decodes_as_backend(tok: Any) -> bool:
    """Whether transformers' ``tok.decode`` gives what its backend
    tokenizer's decode gives, on text holding every pattern the clean-up of
    spaces rewrites. Llama 3's folders ask for clean-up, but transformers 5
    skips it for BPE models (it would corrupt their text), so their decode
    is the backend's; a WordPiece folder's is not."""
    backend = tok.backend_tokenizer
    ids = backend.encode(CLEAN_UP_PROBE, add_special_tokens=False).ids
    return tok.decode(ids) == backend.decode(ids)


class LazyFastTokenizer:
    """encode / decode / the special ids / chat_template / backend_tokenizer
    from `tokenizers`; anything else from a `PreTrainedTokenizerFast` made
    on first use. Once that object exists every call goes to it, so what a
    caller changes through it (``add_special_tokens``, a new
    ``chat_template``) is what later calls see; setting a public attribute
    sets it there. A copy is transformers' own object."""

    def __init__(self, directory: str):
        from tokenizers import Tokenizer
        self._directory = directory
        with open(os.path.join(directory, CONFIG_FILE)) as f:
            self._config = json.load(f)
        self._backend = Tokenizer.from_file(os.path.join(directory, TOKENIZER_FILE))
        self._ids = {key: self._special_id(key)
                     for key in ("eos_token", "bos_token", "pad_token")}
        if self._ids["eos_token"] is None and "eos_token" in self._config:
            raise ValueError(f"eos_token {self._config['eos_token']!r} is not "
                             "in the vocabulary")
        template = self._config.get("chat_template")
        path = os.path.join(directory, "chat_template.jinja")
        if template is None and os.path.isfile(path):
            with open(path) as f:
                template = f.read()
        self._template = template
        self._full = None
        self._lock = threading.Lock()

    def _special_id(self, key: str) -> int | None:
        text = _token_text(self._config.get(key))
        return None if text is None else self._backend.token_to_id(text)

    @property
    def full(self) -> Any:
        """The `PreTrainedTokenizerFast` of the same folder (made once)."""
        with self._lock:
            if self._full is None:
                from transformers import PreTrainedTokenizerFast
                self._full = PreTrainedTokenizerFast.from_pretrained(
                    self._directory, local_files_only=True)
            return self._full

    # -- the hot paths ------------------------------------------------------

    def encode(self, text: Any, add_special_tokens: bool = True,
               **kwargs: Any) -> list[int]:
        if self._full is not None or kwargs or not isinstance(text, str):
            return self.full.encode(text, add_special_tokens=add_special_tokens,
                                    **kwargs)
        return self._backend.encode(
            text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: int | Iterable[int],
               skip_special_tokens: bool = False, **kwargs: Any) -> str:
        if self._full is not None or kwargs:
            return self.full.decode(token_ids,
                                    skip_special_tokens=skip_special_tokens,
                                    **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self._backend.decode([int(t) for t in token_ids],
                                    skip_special_tokens=skip_special_tokens)

    @property
    def backend_tokenizer(self) -> Any:
        return self._backend if self._full is None else self._full.backend_tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self._ids["eos_token"] if self._full is None else self._full.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self._ids["bos_token"] if self._full is None else self._full.bos_token_id

    @property
    def pad_token_id(self) -> int | None:
        return self._ids["pad_token"] if self._full is None else self._full.pad_token_id

    @property
    def chat_template(self) -> str | None:
        return self._template if self._full is None else self._full.chat_template

    @property
    def name_or_path(self) -> str:
        return self._directory

    # -- everything else: transformers' own object --------------------------

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined above; private names (pickle's
        # and copy's probes among them) are not forwarded.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.full, name, value)

    def __len__(self) -> int:
        return len(self.full)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.full(*args, **kwargs)

    def __copy__(self) -> Any:
        return copy.copy(self.full)

    def __deepcopy__(self, memo: dict) -> Any:
        return copy.deepcopy(self.full, memo)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (LazyFastTokenizer, (self._directory,))

    def __repr__(self) -> str:
        return f"LazyFastTokenizer({self._directory!r})"


def hf_tokenizer(tokenizer: Any) -> Any:
    """transformers' object behind ``tokenizer`` (itself when it is one)."""
    return tokenizer.full if isinstance(tokenizer, LazyFastTokenizer) else tokenizer
