"""The cached GGUF tokenizer served by `tokenizers` alone (fast_tokenizer.py)
answers exactly as transformers' PreTrainedTokenizerFast of the same folder,
and a start that only encodes and decodes never imports transformers."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.fast_tokenizer import CLEAN_UP_PROBE, LazyFastTokenizer, serves_fast
from jaxinfer.gguf_tokenizer import byte_level_bpe_tokenizer
from jaxinfer.models.embedded import embedded_model_path

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The embedded model's tokenizer saved as tokenizer.py's cache does."""
    directory = str(tmp_path_factory.mktemp("tokenizer"))
    byte_level_bpe_tokenizer(
        embedded_model_path("smollm2-135m-instruct")).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def pair(saved):
    from transformers import PreTrainedTokenizerFast
    return LazyFastTokenizer(saved), PreTrainedTokenizerFast.from_pretrained(saved)


texts = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(SPECIALS),
                           st.sampled_from([" ", "\n\n", "  x", "12345", "élan"])),
                 max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=texts, add_special=st.booleans(), skip=st.booleans())
def test_encode_and_decode_equal_transformers(pair, text, add_special, skip):
    fast, hf = pair
    ids = fast.encode(text, add_special_tokens=add_special)
    assert ids == hf.encode(text, add_special_tokens=add_special)
    assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(
        ids, skip_special_tokens=skip)
    if ids:
        assert fast.decode(ids[0]) == hf.decode(ids[0])


def test_special_ids_template_and_everything_else(saved, pair):
    fast, hf = LazyFastTokenizer(saved), pair[1]
    assert (fast.eos_token_id, fast.bos_token_id, fast.pad_token_id) == (
        hf.eos_token_id, hf.bos_token_id, hf.pad_token_id)
    assert fast.eos_token_id is not None
    assert fast.chat_template == hf.chat_template and fast.chat_template
    assert fast._full is None  # nothing above needed transformers
    # Anything else is the HF object's own answer.
    msgs = [{"role": "user", "content": "hi"}]
    assert fast.apply_chat_template(msgs, add_generation_prompt=True) == \
        hf.apply_chat_template(msgs, add_generation_prompt=True)
    assert fast.convert_ids_to_tokens([1, 2, 300]) == \
        hf.convert_ids_to_tokens([1, 2, 300])
    assert len(fast) == len(hf)
    assert fast("a b").input_ids == hf("a b").input_ids
    assert fast._full is not None
    with pytest.raises(AttributeError):
        _ = fast._no_such_private_name
    again = pickle.loads(pickle.dumps(fast))
    assert again.encode("<|im_start|>hi") == fast.encode("<|im_start|>hi")


def test_changes_made_through_transformers_are_seen(saved):
    """Once transformers' object exists every call goes to it: a token added
    or a template set through the wrapper is what encode, decode and the
    detokenizer's backend see. A copy is transformers' own object."""
    import copy

    from transformers import PreTrainedTokenizerBase
    fast = LazyFastTokenizer(saved)
    before = fast.encode("a <image> b")
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    new_id = fast.convert_tokens_to_ids("<image>")
    assert new_id not in before and new_id in fast.encode("a <image> b")
    assert fast.backend_tokenizer.token_to_id("<image>") == new_id
    assert fast.decode([new_id], skip_special_tokens=True) == ""
    fast.chat_template = "{{ messages[0]['content'] }}"
    assert fast.chat_template == fast.full.chat_template == \
        "{{ messages[0]['content'] }}"
    fast.eos_token = "<|endoftext|>"
    assert fast.eos_token_id == fast.full.convert_tokens_to_ids("<|endoftext|>")
    for twin in (copy.copy(LazyFastTokenizer(saved)), copy.deepcopy(fast)):
        assert isinstance(twin, PreTrainedTokenizerBase)
    assert copy.deepcopy(fast).convert_tokens_to_ids("<image>") == new_id


def test_llm_get_tokenizer_is_transformers_own(saved):
    """vLLM's LLM.get_tokenizer() gives the HF tokenizer: so does ours, for
    the same wrapper the engine serves."""
    from transformers import PreTrainedTokenizerBase

    from jaxinfer.entrypoints.llm import LLM
    llm = LLM.__new__(LLM)
    llm.llm_engine = type("Engine", (), {"tokenizer": LazyFastTokenizer(saved)})()
    assert isinstance(llm.get_tokenizer(), PreTrainedTokenizerBase)
    assert llm.get_tokenizer() is llm.llm_engine.tokenizer.full


def test_only_plain_saved_folders_are_served_fast(saved, tmp_path):
    assert serves_fast(saved)
    assert not serves_fast(str(tmp_path))  # no config at all
    with open(os.path.join(saved, "tokenizer_config.json")) as f:
        config = json.load(f)
    for change in ({"tokenizer_class": "LlamaTokenizer"},
                   {"clean_up_tokenization_spaces": True}):
        other = tmp_path / next(iter(change))
        other.mkdir()
        for name in os.listdir(saved):
            (other / name).write_bytes(open(os.path.join(saved, name), "rb").read())
        (other / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        assert not serves_fast(str(other))


def _copy_folder(src: str, dst, config_changes=None, files=None) -> str:
    dst.mkdir()
    for name in os.listdir(src):
        (dst / name).write_bytes(open(os.path.join(src, name), "rb").read())
    if config_changes:
        with open(os.path.join(src, "tokenizer_config.json")) as f:
            config = json.load(f)
        (dst / "tokenizer_config.json").write_text(
            json.dumps({**config, **config_changes}))
    for name, text in (files or {}).items():
        (dst / name).write_text(text)
    return str(dst)


def test_a_model_folder_is_served_fast_after_transformers_chose_plain(
        saved, tmp_path, monkeypatch):
    """A model folder's first load goes through AutoTokenizer; where that
    gave a plain fast tokenizer, the next start serves the same files with
    `tokenizers` alone, answering alike. Where transformers picks a class of
    its own (a Qwen2 config.json: Qwen2Tokenizer, whose pre-tokenizer splits
    digits unlike tokenizer.json), or its decode cleans up spaces, every
    start is transformers'. A config asking for clean-up that transformers
    does not apply (BPE, as Llama 3's folders) is served fast. A changed
    file is judged again."""
    from transformers import PreTrainedTokenizerBase

    from jaxinfer import tokenizer
    from jaxinfer.models import TokenizerSource
    monkeypatch.setenv("JAXINFER_WEIGHT_CACHE_DIR", str(tmp_path / "cache"))

    def load(folder):
        tokenizer.load_tokenizer.cache_clear()
        return tokenizer.load_tokenizer(TokenizerSource(directory=folder))
    llama = _copy_folder(saved, tmp_path / "llama", files={
        "config.json": json.dumps({"model_type": "llama"})})
    qwen = _copy_folder(saved, tmp_path / "qwen", files={
        "config.json": json.dumps({"model_type": "qwen2"})})
    asks_clean_up = _copy_folder(saved, tmp_path / "asks-clean-up",
                                 {"clean_up_tokenization_spaces": True})
    cleans_up = _copy_folder(saved, tmp_path / "cleans-up", {
        "clean_up_tokenization_spaces": True,
        "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output":
            True})
    text = "<|im_start|>user The capital of France is 12345 élan"
    first = load(llama)
    assert not isinstance(first, LazyFastTokenizer)
    assert isinstance(first, PreTrainedTokenizerBase)
    second = load(llama)
    assert isinstance(second, LazyFastTokenizer)
    assert second.encode(text) == first.encode(text)
    probe = first.backend_tokenizer.encode(CLEAN_UP_PROBE,
                                           add_special_tokens=False).ids
    forced = load(cleans_up)  # transformers' clean-up does rewrite the probe
    assert forced.decode(probe) != first.backend_tokenizer.decode(probe)
    for folder in (qwen, cleans_up):
        for _ in range(2):
            tok = load(folder)
            assert not isinstance(tok, LazyFastTokenizer)
    slow = load(asks_clean_up)
    assert not isinstance(slow, LazyFastTokenizer)
    fast = load(asks_clean_up)
    assert isinstance(fast, LazyFastTokenizer)
    assert fast.decode(probe) == slow.decode(probe) == CLEAN_UP_PROBE
    # A different tokenizer.json is a different verdict.
    (tmp_path / "llama" / "tokenizer.json").write_text(
        open(os.path.join(saved, "tokenizer.json")).read() + "\n")
    assert not isinstance(load(llama), LazyFastTokenizer)
    assert isinstance(load(llama), LazyFastTokenizer)
    # With the cache off, every start is transformers'.
    monkeypatch.setenv("JAXINFER_WEIGHT_CACHE_DIR", "")
    assert not isinstance(load(llama), LazyFastTokenizer)
    tokenizer.load_tokenizer.cache_clear()


def test_a_warm_start_that_only_encodes_never_imports_transformers(saved):
    """The README's main job needs encode, decode and EOS: a process that
    loads the cached tokenizer through load_tokenizer and uses them has no
    transformers module afterwards."""
    script = textwrap.dedent(f"""
        import sys
        from jaxinfer.models import TokenizerSource
        from jaxinfer import tokenizer
        source = TokenizerSource(directory="/nonexistent", gguf_file="x.gguf",
                                 cache_dir={os.path.dirname(saved)!r})
        tokenizer.CACHED_TOKENIZER_DIR = {os.path.basename(saved)!r}
        tok = tokenizer.load_tokenizer(source)
        ids = tok.encode("<|im_start|>user The capital of France is")
        print(tok.decode(ids, skip_special_tokens=True), tok.eos_token_id)
        print(sorted(m for m in sys.modules if m.split(".")[0] in
                     ("transformers", "torch")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert out[0] == "user The capital of France is 2"
    assert out[1] == "[]"
