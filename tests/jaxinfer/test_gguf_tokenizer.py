"""Our torch-free GGUF tokenizer equals transformers' own GGUF conversion."""

import os

import pytest

from jaxinfer.gguf_tokenizer import byte_level_bpe_tokenizer
from jaxinfer.models.embedded import embedded_model_path

TEXTS = [
    "Hello world", "The year 2018 was 12345 67.89", "  leading spaces\n\n\ttabs",
    "naïve café 日本語 🙂 emoji", "<|im_start|>user\nhi<|im_end|>",
    "don't I'll we've", "<|endoftext|> special", "x" * 50, "",
]


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer
    path = embedded_model_path("smollm2-135m-instruct")
    directory, name = os.path.split(path)
    return byte_level_bpe_tokenizer(path), AutoTokenizer.from_pretrained(
        directory, gguf_file=name)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tokenizers, text):
    ours, hf = tokenizers
    ids = ours.encode(text)
    assert ids == hf.encode(text)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
            ids, skip_special_tokens=skip)


def test_special_tokens_and_chat_template_match(tokenizers):
    ours, hf = tokenizers
    assert (ours.bos_token_id, ours.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert sorted(ours.all_special_ids) == sorted(hf.all_special_ids)
    assert len(ours) == len(hf)
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) \
        == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
