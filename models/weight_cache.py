"""A converted copy of each GGUF model, kept on disk and keyed by the file's
hash, so that only the first start pays for parsing and dequantizing.

Parsing a GGUF file (its metadata holds the whole vocabulary) and
dequantizing every tensor take seconds on a laptop CPU, every start. The
first start of a file therefore writes an entry:

    <root>/<sha256 of the GGUF>/
        config.json                HF-style config rebuilt from the metadata
        model-00001.safetensors    the tensors the model needs, float32, in
        ...                        HF names and layout (q/k un-permuted)
        manifest.json              written last: format, source, tensor list

and later starts read ``config.json`` and map the safetensors files, without
opening the GGUF beyond hashing it; the hash itself is remembered beside the
file's identity (``source_digest``), so an unchanged file is not read at
all. The tokenizer's fast form
(``tokenizer.json``) is saved into the same folder by ``jaxinfer.tokenizer``.

Keying by content (not path or mtime) means an edited or replaced file never
meets a stale entry; building an entry for a path also removes the entries
earlier versions of that path left behind. An entry that does not read back
(truncated, overwritten, half-written by a killed process) is deleted and
rebuilt. Entries are written to a temporary folder and renamed into place,
so concurrent first starts (pytest-xdist workers) never see half an entry.

Location: ``$JAXINFER_WEIGHT_CACHE_DIR``, else ``~/.cache/jaxinfer/gguf``;
an empty value turns the cache off (every start converts the file again).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import mmap
import os
import shutil
import struct
import tempfile
from collections.abc import Iterable

import numpy as np

from .errors import CheckpointError

logger = logging.getLogger(__name__)

ENV_VAR = "JAXINFER_WEIGHT_CACHE_DIR"
DEFAULT_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "jaxinfer",
                            "gguf")
# Bump when the layout of an entry changes: older entries are then rebuilt.
FORMAT_VERSION = 1
# Host arrays on this byte boundary go to JAX's CPU device without a copy
# (the device buffer is the array's memory: `_MappedFile.array`).
ZERO_COPY_ALIGN = 64
MANIFEST = "manifest.json"
CONFIG = "config.json"
# Tensors are written in files of at most this many bytes, so building an
# entry holds one file's worth of float32 tensors in memory, not the model.
SHARD_BYTES = 2 << 30


def cache_root() -> str | None:
    """The cache folder, or None when the cache is turned off."""
    root = os.environ.get(ENV_VAR)
    if root is None:
        return DEFAULT_ROOT
    return root or None


def file_digest(path: str) -> str:
    """sha256 of the file's bytes, hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


DIGESTS = ".digests"  # <root>/.digests/<sha256 of the path>.json (hidden: not an entry)


def source_digest(path: str, root: str) -> str:
    """``file_digest(path)``, remembered under ``root`` beside the file's
    identity (device, inode, size, modification and change times in ns): a
    start that finds the file unchanged skips reading it; any write or
    replacement changes the identity, and the file is hashed again."""
    st = os.stat(path)
    ident = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    memo = os.path.join(root, DIGESTS, hashlib.sha256(
        os.path.abspath(path).encode()).hexdigest() + ".json")
    try:
        with open(memo) as f:
            seen = json.load(f)
        if seen["identity"] == ident and len(seen["sha256"]) == 64:
            return seen["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: hash the file
    digest = file_digest(path)
    try:
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(memo), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"path": os.path.abspath(path), "identity": ident,
                       "sha256": digest}, f)
        os.replace(tmp, memo)
    except OSError as e:  # a read-only cache still serves; it just rehashes
        logger.debug("could not remember %s's digest: %s", path, e)
    return digest


@dataclasses.dataclass
class CachedWeights:
    """One valid entry: ``hf_config`` and ``get(hf_name)`` (the reader
    interface ``weights.build_params`` takes), read from mapped files."""
    directory: str
    hf_config: dict
    files: dict[str, str]  # tensor name -> safetensors file in the entry

    def get(self, hf_name: str) -> np.ndarray | None:
        fname = self.files.get(hf_name)
        if fname is None:
            return None
        return _mapped(os.path.join(self.directory, fname)).array(hf_name)


class _MappedFile:
    """One safetensors file of an entry, mapped read-only. ``array(name)``
    is a view of the mapped bytes, not a copy: the device copy the loader
    makes is the only one (``safe_open`` would copy every tensor first).
    The format
    (a little-endian u64 header size, a JSON header of dtype, shape and
    data offsets, then the data) is safetensors' published layout, and
    these files are our own float32 ones."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self.map) < 8:
            raise CheckpointError(f"{path}: {len(self.map)} bytes, no header")
        (n,) = struct.unpack("<Q", self.map[:8])
        if 8 + n > len(self.map):
            raise CheckpointError(f"{path}: header runs past the file's end")
        header = json.loads(self.map[8:8 + n])
        header.pop("__metadata__", None)
        self.base = 8 + n
        self.tensors = {}
        for name, info in header.items():
            start, end = info["data_offsets"]
            shape = tuple(info["shape"])
            if info["dtype"] != "F32" or end - start != 4 * math.prod(shape):
                raise CheckpointError(f"{path}: {name} is {info['dtype']} "
                                      f"{shape} in {end - start} bytes, "
                                      "not the float32 the cache writes")
            if self.base + end > len(self.map):
                raise CheckpointError(f"{path}: {name} runs past the "
                                      "file's end (truncated)")
            self.tensors[name] = (start, shape)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name][1]

    def array(self, name: str) -> np.ndarray:
        start, shape = self.tensors[name]
        view = np.frombuffer(self.map, np.float32, math.prod(shape),
                             self.base + start).reshape(shape)
        if view.ctypes.data % ZERO_COPY_ALIGN == 0:
            # JAX's CPU client would use this view in place as the param:
            # a file damaged in place would then change a running engine's
            # weights (or kill it, truncated). A copy keeps them its own.
            view = view.copy()
        return view


_handles: dict[str, _MappedFile] = {}


def _mapped(path: str) -> _MappedFile:
    """Each file is mapped once per process; its tensors are read from the
    mapping on demand."""
    handle = _handles.get(path)
    if handle is None:
        handle = _handles[path] = _MappedFile(path)
    return handle


def _forget(directory: str) -> None:
    for path in [p for p in _handles if p.startswith(directory + os.sep)]:
        del _handles[path]


def read_entry(directory: str, digest: str) -> CachedWeights:
    """The entry in ``directory``; raises CheckpointError when it is
    incomplete or does not read back as written."""
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"format {manifest.get('format')!r}, "
                                  f"expected {FORMAT_VERSION}")
        if manifest.get("sha256") != digest:
            raise CheckpointError("made from another file")
        with open(os.path.join(directory, CONFIG)) as f:
            hf_config = json.load(f)
        files = {}
        for fname, tensors in manifest["files"].items():
            handle = _mapped(os.path.join(directory, fname))
            for name, shape in tensors.items():
                # Reads the header only; the data stays mapped until used.
                got = handle.shape(name)
                if list(got) != list(shape):
                    raise CheckpointError(f"{name} has shape {got}, the "
                                          f"manifest says {shape}")
                files[name] = fname
    except CheckpointError:
        _forget(directory)
        raise
    except Exception as e:  # json, OSError, safetensors' own errors
        _forget(directory)
        raise CheckpointError(f"{type(e).__name__}: {e}") from e
    return CachedWeights(directory, hf_config, files)


def write_entry(root: str, digest: str, source: str, hf_config: dict,
                tensors: Iterable[tuple[str, np.ndarray]]) -> str:
    """Writes an entry from ``tensors`` (an iterable of (hf_name, float32
    array)) and returns its folder. Another process that finished the same
    entry first wins; ours is dropped."""
    from safetensors.numpy import save_file
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, digest)
    tmp = tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=root)
    try:
        files: dict[str, dict[str, list[int]]] = {}
        shard: dict[str, np.ndarray] = {}
        size = 0

        def flush() -> None:
            nonlocal shard, size
            fname = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, os.path.join(tmp, fname))
            files[fname] = {k: list(v.shape) for k, v in shard.items()}
            shard, size = {}, 0

        for name, array in tensors:
            array = np.ascontiguousarray(array, dtype=np.float32)
            if shard and size + array.nbytes > SHARD_BYTES:
                flush()
            shard[name] = array
            size += array.nbytes
        if shard or not files:
            flush()
        with open(os.path.join(tmp, CONFIG), "w") as f:
            json.dump(hf_config, f)
        manifest = {"format": FORMAT_VERSION, "sha256": digest,
                    "source": os.path.abspath(source), "files": files}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f)
        if os.path.isdir(final):  # a corrupt entry, or another process won
            try:
                read_entry(final, digest)
                return final
            except CheckpointError:
                _forget(final)
                shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:  # another process renamed its copy in meanwhile
            pass
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_entries(root: str, source: str, keep: str) -> list[str]:
    """Deletes the entries built from earlier contents of ``source``."""
    source = os.path.abspath(source)
    removed = []
    for name in os.listdir(root):
        entry = os.path.join(root, name)
        if name == keep or name.startswith(".") or not os.path.isdir(entry):
            continue
        try:
            with open(os.path.join(entry, MANIFEST)) as f:
                if json.load(f).get("source") != source:
                    continue
        except (OSError, ValueError):
            continue
        _forget(entry)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed
