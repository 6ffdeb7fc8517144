"""The GGUF weight cache (models/weight_cache.py): a second start reads the
converted entry instead of the GGUF, a changed file gets a new entry (and the
old one goes), and a damaged entry is rebuilt rather than crashing."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import load_params, resolve_model, weight_cache
from jaxinfer.models import loader as loader_module
from jaxinfer.models.weights import weight_specs


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = str(tmp_path / "weight-cache")
    monkeypatch.setenv(weight_cache.ENV_VAR, root)
    return root


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_factory, tmp_path_factory):
    from tests.models.test_loaders import _write_llama_gguf
    hf_dir = tiny_model_factory("llama", "llama3")
    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    _write_llama_gguf(hf_dir, path)
    return hf_dir, path


def _entries(root):
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


def _params(path):
    return load_params(resolve_model(path), jnp.float32)


def _assert_same(a, b):
    import jax
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _no_gguf_parsing(monkeypatch):
    def refuse(path):
        raise AssertionError(f"the GGUF {path} was parsed on a cache hit")
    monkeypatch.setattr(loader_module, "GGUFReader", refuse)


def test_second_start_reads_the_cache_not_the_gguf(tiny_gguf, cache_root,
                                                   monkeypatch):
    _, path = tiny_gguf
    first = resolve_model(path)
    assert isinstance(first.reader, weight_cache.CachedWeights)
    entry = os.path.join(cache_root, weight_cache.file_digest(path))
    assert _entries(cache_root) == [os.path.basename(entry)]
    want = load_params(first, jnp.float32)
    _no_gguf_parsing(monkeypatch)
    second = resolve_model(path)
    assert second.reader.directory == entry
    assert second.config == first.config
    assert second.hf_config == first.hf_config
    _assert_same(load_params(second, jnp.float32), want)


def test_cached_tensors_equal_the_gguf_readers(tiny_gguf, cache_root,
                                               monkeypatch):
    _, path = tiny_gguf
    cached = resolve_model(path)
    monkeypatch.setenv(weight_cache.ENV_VAR, "")  # cache off: the GGUF itself
    direct = resolve_model(path)
    assert not isinstance(direct.reader, weight_cache.CachedWeights)
    assert direct.hf_config == cached.hf_config
    for spec in weight_specs(direct.config):
        name = spec.hf_name
        np.testing.assert_array_equal(cached.reader.get(name),
                                      direct.reader.get(name), err_msg=name)


def test_changed_gguf_gets_a_new_entry_and_drops_the_old(
        tiny_gguf, cache_root, tmp_path):
    from safetensors.torch import load_file, save_file

    from tests.models.test_loaders import _write_llama_gguf
    hf_dir, original = tiny_gguf
    path = str(tmp_path / "model.gguf")
    with open(original, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    before = _params(path)
    old = _entries(cache_root)
    # The same path, rewritten with one tensor changed.
    edited = tmp_path / "edited"
    edited.mkdir()
    for name in os.listdir(hf_dir):
        if not name.endswith(".safetensors"):
            os.symlink(os.path.join(hf_dir, name), edited / name)
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] * 3
    save_file(sd, str(edited / "model.safetensors"))
    os.remove(path)
    _write_llama_gguf(str(edited), path)
    after = _params(path)
    new = _entries(cache_root)
    assert len(old) == len(new) == 1 and old != new
    np.testing.assert_allclose(np.asarray(after["norm"]["scale"]),
                               3 * np.asarray(before["norm"]["scale"]),
                               rtol=1e-6)


def _truncate_tensors(entry):
    shard = os.path.join(entry, "model-00001.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)


def _garbage_tensors(entry):
    with open(os.path.join(entry, "model-00001.safetensors"), "wb") as f:
        f.write(b"\x00not safetensors at all")


def _garbage_manifest(entry):
    with open(os.path.join(entry, weight_cache.MANIFEST), "w") as f:
        f.write("{truncated")


def _no_manifest(entry):  # a build killed before it finished
    os.remove(os.path.join(entry, weight_cache.MANIFEST))


def _wrong_shape_in_manifest(entry):
    path = os.path.join(entry, weight_cache.MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    tensors = manifest["files"]["model-00001.safetensors"]
    tensors["model.norm.weight"] = [1, 2, 3]
    with open(path, "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("damage", [_truncate_tensors, _garbage_tensors,
                                    _garbage_manifest, _no_manifest,
                                    _wrong_shape_in_manifest])
def test_damaged_entry_is_rebuilt(tiny_gguf, cache_root, damage):
    _, path = tiny_gguf
    want = _params(path)
    entry = os.path.join(cache_root, weight_cache.file_digest(path))
    weight_cache._forget(entry)  # as a new process would
    damage(entry)
    # Damage surfaces in whichever reader meets it first (json, safetensors).
    with pytest.raises(Exception):  # noqa: B017 - see above
        weight_cache.read_entry(entry, weight_cache.file_digest(path))
    _assert_same(_params(path), want)
    weight_cache._forget(entry)
    weight_cache.read_entry(entry, weight_cache.file_digest(path))  # healed


def test_cache_off_writes_nothing(tiny_gguf, tmp_path, monkeypatch):
    _, path = tiny_gguf
    monkeypatch.setenv(weight_cache.ENV_VAR, "")
    monkeypatch.setattr(weight_cache, "DEFAULT_ROOT", str(tmp_path / "default"))
    files = resolve_model(path)
    assert not isinstance(files.reader, weight_cache.CachedWeights)
    assert not os.path.exists(tmp_path / "default")


def test_unwritable_cache_falls_back_to_the_gguf(tiny_gguf, tmp_path,
                                                  monkeypatch):
    _, path = tiny_gguf
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(weight_cache.ENV_VAR, str(blocker / "cache"))
    files = resolve_model(path)
    assert not isinstance(files.reader, weight_cache.CachedWeights)
    assert load_params(files, jnp.float32)["norm"]["scale"].shape == (
        files.config.hidden_size,)


@pytest.mark.slow
def test_embedded_tokenizer_is_cached_in_fast_form(embedded_gguf_path,
                                                   cache_root, monkeypatch):
    """The first start saves the GGUF tokenizer's fast form into the entry;
    the next one loads it without the GGUF and encodes identically; a
    damaged copy is rebuilt."""
    from jaxinfer import gguf_tokenizer, tokenizer
    files = resolve_model(embedded_gguf_path)
    tokenizer.load_tokenizer.cache_clear()
    first = tokenizer.load_tokenizer(files.tokenizer)
    saved = os.path.join(files.reader.directory,
                         tokenizer.CACHED_TOKENIZER_DIR)
    assert os.path.isfile(os.path.join(saved, "tokenizer.json"))
    text = "<|im_start|>user\nThe capital of France is? 12345 élan<|im_end|>"
    conv = [{"role": "user", "content": "Hi"}]

    def refuse(path):
        raise AssertionError("the GGUF vocabulary was parsed again")
    tokenizer.load_tokenizer.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(gguf_tokenizer, "byte_level_bpe_tokenizer", refuse)
        second = tokenizer.load_tokenizer(files.tokenizer)
    assert second.encode(text) == first.encode(text)
    assert (second.eos_token_id, second.bos_token_id) == (
        first.eos_token_id, first.bos_token_id)
    assert second.apply_chat_template(conv, tokenize=False) == \
        first.apply_chat_template(conv, tokenize=False)
    with open(os.path.join(saved, "tokenizer.json"), "w") as f:
        f.write("{broken")
    tokenizer.load_tokenizer.cache_clear()
    third = tokenizer.load_tokenizer(files.tokenizer)
    assert third.encode(text) == first.encode(text)
    assert gguf_tokenizer.byte_level_bpe_tokenizer is not refuse
    tokenizer.load_tokenizer.cache_clear()


def test_an_unchanged_file_is_not_hashed_again(tiny_gguf, cache_root,
                                               monkeypatch, tmp_path):
    _, original = tiny_gguf
    path = str(tmp_path / "model.gguf")
    with open(original, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    hashed = []
    real = weight_cache.file_digest
    monkeypatch.setattr(weight_cache, "file_digest",
                        lambda p: hashed.append(p) or real(p))
    digest = weight_cache.source_digest(path, cache_root)
    assert digest == real(path) and len(hashed) == 1
    assert weight_cache.source_digest(path, cache_root) == digest
    assert len(hashed) == 1  # remembered: the file was not read again
    # Same size, one byte changed, modification time put back: the change
    # time still moves, so the file is hashed again.
    st = os.stat(path)
    import time
    time.sleep(0.05)
    with open(path, "r+b") as f:
        f.seek(st.st_size - 1)
        last = f.read(1)
        f.seek(st.st_size - 1)
        f.write(bytes([last[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = weight_cache.source_digest(path, cache_root)
    assert len(hashed) == 2 and changed == real(path) != digest


def test_a_mapped_tensor_is_never_the_device_buffer(tmp_path):
    """JAX's CPU client uses a 64-byte-aligned host array in place: such a
    tensor of the mapped file is copied first, so that a file damaged in
    place cannot change (or, truncated, kill) a running engine's params."""
    import jax
    from safetensors.numpy import save_file
    tensors = {"w": np.arange(64, dtype=np.float32).reshape(4, 16),
               "v": np.ones((16,), np.float32)}
    aligned = None
    for pad in range(64):  # a metadata length that puts the data on 64
        path = str(tmp_path / f"{pad}.safetensors")
        save_file(tensors, path, metadata={"pad": " " * pad})
        mapped = weight_cache._MappedFile(path)
        if mapped.base % weight_cache.ZERO_COPY_ALIGN == 0:
            aligned = mapped
            break
    assert aligned is not None
    mapped_at = np.frombuffer(aligned.map, np.uint8).ctypes.data + aligned.base
    for name, want in tensors.items():
        arr = aligned.array(name)
        np.testing.assert_array_equal(arr, want)
        start = aligned.tensors[name][0]
        assert arr.ctypes.data != mapped_at + start  # a copy, not the map
        placed = jax.device_put(arr)
        assert placed.unsafe_buffer_pointer() != mapped_at + start
