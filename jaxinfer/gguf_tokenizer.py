"""A fast HF tokenizer rebuilt from a GGUF file's metadata, without torch.

transformers can read a GGUF tokenizer too, but its GGUF reader imports torch,
which the main job (text generation on a laptop CPU) must not need. Byte-level
BPE vocabularies (``tokenizer.ggml.model == "gpt2"``: SmolLM, Llama 3, Qwen)
are rebuilt here with `tokenizers`, matching transformers' own conversion
token for token (tests compare the two); other vocabularies go through
transformers.
"""

from __future__ import annotations

from typing import Any

from jaxinfer.models.gguf_loader import open_gguf

# Pre-tokenizer splits by llama.cpp's `tokenizer.ggml.pre`; anything else gets
# GPT-2's byte-level split (as transformers does).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
           "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}

_CONTROL, _USER_DEFINED = 3, 4


def _byte_alphabet() -> set[str]:
    """The 256 characters GPT-2's byte-level BPE spells bytes with."""
    keep = (list(range(ord("!"), ord("~") + 1)) +
            list(range(ord("¡"), ord("¬") + 1)) +
            list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            chars.append(256 + n)
            n += 1
    return {chr(c) for c in chars}


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def byte_level_bpe_tokenizer(gguf_path: str) -> Any:
    """A `PreTrainedTokenizerFast` for a byte-level BPE GGUF vocabulary, or
    None when the file holds another kind of vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    reader = open_gguf(gguf_path)
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        return None
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [])) or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1))
              for m in _field(reader, "tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None,
                               continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    split = _SPLITS.get(_field(reader, "tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|> ...) stay whole and are special; a
    # "control" token spelled outside the byte alphabet is a llama.cpp
    # mislabel and is left alone, as transformers does.
    alphabet = _byte_alphabet()
    tok.add_special_tokens([
        AddedToken(t, normalized=False, special=True)
        for t, ty in zip(tokens, types)
        if int(ty) == _CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types) if int(ty) == _USER_DEFINED])

    def special(key: str) -> str | None:
        idx = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(idx)] if idx is not None else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special("bos_token_id"), eos_token=special("eos_token_id"),
        unk_token=special("unknown_token_id"),
        pad_token=special("padding_token_id"),
        chat_template=_field(reader, "tokenizer.chat_template"),
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        add_eos_token=bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        clean_up_tokenization_spaces=False)
