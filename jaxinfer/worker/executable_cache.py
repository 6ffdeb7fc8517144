"""Compiled step programs kept on disk, so that a warm start skips tracing
and lowering as well as XLA (the persistent compilation cache only skips
XLA, and lowering a large model's step programs again takes most of a warm
start).

Warm-up saves each program it compiles (`jax.experimental.serialize_executable`)
under a fingerprint of everything a program depends on besides its own
key: jax and jaxlib, the devices, XLA's flags, jaxinfer's own source, the
model's config and the parameters', pages' and constants' shapes,
dtypes and shardings. A later warm-up of the same engine loads them
instead of lowering. A change to any of those is a new fingerprint, so an
old entry is never read for a different program; an entry that does not
load is deleted and compiled again.

Programs loaded or compiled in this process are also kept in memory and
handed to later engines of the same fingerprint as they are: on CPU an
executable deserialized in the process that compiled it can fail at run
time (``NOT_FOUND: Function wrapped_iota not found``), so
an engine never reads back what its own process wrote.

The folder keeps the programs of the KEEP_FINGERPRINTS newest
fingerprints: each upgrade or model change starts a new one, and older
ones are deleted when a new one is first written, so the disk use is
bounded.

Pytree structures do not serialize; each entry keeps an example of its
input and output trees (the structures with int leaves) and rebuilds them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import os
import pickle
import tempfile
from collections.abc import Callable

import jax

logger = logging.getLogger(__name__)

ENTRY_SUFFIX = ".exe"

# Fingerprint folders kept on disk (the newest by last write).
KEEP_FINGERPRINTS = 4

# (fingerprint, program key digest) -> executable, for this process.
_IN_PROCESS: dict[tuple[str, str], object] = {}


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over jaxinfer's own Python files (paths and contents)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def _layout(tree) -> str:
    """Shapes, dtypes and shardings of an array tree, as text."""
    def one(x):
        return (tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None)))
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return repr((treedef, [one(x) for x in leaves]))


def programs_fingerprint(programs, state) -> str:
    """What a `StepPrograms`' programs depend on besides their keys: the
    platform, jaxinfer's source, the model and engine configs and the
    layouts of the device state (`DeviceState`) they read."""
    import jaxlib
    model = programs.model
    parts = [jax.__version__, getattr(jaxlib, "__version__", ""),
             jax.default_backend(), jax.process_index(), jax.process_count(),
             repr([(d.platform, d.device_kind, d.id) for d in jax.devices()]),
             os.environ.get("XLA_FLAGS", ""), source_digest(),
             repr(model.cfg), str(model.dtype), repr(model.backend),
             programs.block_size, repr(programs.placement.mesh),
             _layout(state.params), _layout(state.kv_pages),
             _layout(state.constants), _layout(state.prev_tokens),
             repr(programs.scheduler_config), repr(programs.cache_config),
             # Few-row programs' XLA options (compile_options.py).
             repr(programs.decode_options),
             # LoRA slots' ranks and targets shape the adapter programs.
             repr(programs.lora_config),
             # An EAGLE head's taps add an output to the forward programs.
             repr(programs.hidden_taps)]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _kernel_runtimes() -> None:
    """Mosaic GPU kernels find their host runtime through an environment
    variable that importing ``jax.experimental.mosaic.gpu`` sets; a program
    loaded before anything lowered a kernel in this process failed with
    "Failed to lookup host symbol ... anonymous_mosaic_gpu"."""
    if jax.default_backend() == "gpu":
        try:
            importlib.import_module("jax.experimental.mosaic.gpu")
        except ImportError:  # a jaxlib without Mosaic GPU: no such kernels
            pass


def _key_digest(key) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def _example(treedef):
    """The structure with int leaves: picklable, and rebuilds the treedef."""
    return treedef.unflatten(list(range(treedef.num_leaves)))


class ExecutableCache:
    """Step programs of one runner fingerprint, under ``directory``."""

    def __init__(self, directory: str, fingerprint: str):
        self.directory = os.path.join(directory, fingerprint)
        self.fingerprint = fingerprint

    def _path(self, digest: str) -> str:
        return os.path.join(self.directory, digest + ENTRY_SUFFIX)

    def load(self, key):
        """The program for ``key``, or None (then compile it and save)."""
        from jax.experimental import serialize_executable as se
        digest = _key_digest(key)
        exe = _IN_PROCESS.get((self.fingerprint, digest))
        if exe is not None:
            return exe
        path = self._path(digest)
        if not os.path.exists(path):
            return None
        _kernel_runtimes()
        try:
            with open(path, "rb") as f:
                entry = pickle.load(f)
            exe = se.deserialize_and_load(
                entry["executable"],
                jax.tree_util.tree_structure(entry["in_example"]),
                jax.tree_util.tree_structure(entry["out_example"]))
        except Exception as e:  # noqa: BLE001 - whatever a damaged or stale entry raises
            logger.warning("dropping the unreadable saved program %s (%s: %s)",
                           path, type(e).__name__, e)
            try:
                os.remove(path)
            except OSError:
                pass
            return None
        _IN_PROCESS[(self.fingerprint, digest)] = exe
        return exe

    def save(self, key, compiled) -> None:
        """Writes ``compiled`` for ``key`` (atomically: a reader sees the
        whole entry or none); a program that cannot be serialized is only
        kept in memory."""
        from jax.experimental import serialize_executable as se
        digest = _key_digest(key)
        _IN_PROCESS[(self.fingerprint, digest)] = compiled
        try:
            blob, in_tree, out_tree = se.serialize(compiled)
            data = pickle.dumps({"executable": blob,
                                 "in_example": _example(in_tree),
                                 "out_example": _example(out_tree)})
        except Exception as e:  # noqa: BLE001 - a program we cannot keep
            logger.warning("not saving a step program (%s: %s)",
                           type(e).__name__, e)
            return
        if not os.path.isdir(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            prune_fingerprints(os.path.dirname(self.directory),
                               keep=self.fingerprint)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(digest))
        except OSError as e:
            logger.warning("could not save a step program in %s: %s",
                           self.directory, e)
            try:
                os.remove(tmp)
            except OSError:
                pass


def prune_fingerprints(root: str, keep: str,
                       limit: int = KEEP_FINGERPRINTS) -> list[str]:
    """Deletes all but the ``limit`` most recently written fingerprint
    folders under ``root`` (``keep`` always stays); returns those deleted.
    A folder another process is still writing may go: its entries are
    then compiled again, never read half-written."""
    import shutil
    try:
        names = [n for n in os.listdir(root)
                 if os.path.isdir(os.path.join(root, n))]
    except OSError:
        return []
    names.sort(key=lambda n: (n == keep, os.path.getmtime(
        os.path.join(root, n))), reverse=True)
    gone = names[limit:]
    for name in gone:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if gone:
        logger.info("deleted %d saved step-program folders of older "
                    "fingerprints under %s", len(gone), root)
    return gone


def executable_cache_for(fingerprint: Callable[[], str],
                         compilation_cache_dir: str | None,
                         enabled: bool | None = None) -> ExecutableCache | None:
    """The cache in ``<compilation_cache_dir>/executables`` for the
    programs ``fingerprint()`` names (`programs_fingerprint`; called only
    when the cache is on), or None when there is no compilation cache or
    the cache is off. ``enabled`` None: on GPU only
    (``$JAXINFER_EXECUTABLE_CACHE`` = 1 or 0 overrides)."""
    if not compilation_cache_dir:
        return None
    if enabled is None:
        env = os.environ.get("JAXINFER_EXECUTABLE_CACHE", "")
        if env not in ("", "0", "1"):
            raise ValueError(f"JAXINFER_EXECUTABLE_CACHE must be 1 (on), 0 "
                             f"(off) or unset (on GPU only), not {env!r}")
        enabled = env == "1" if env else jax.default_backend() == "gpu"
    if not enabled:
        return None
    return ExecutableCache(os.path.join(compilation_cache_dir, "executables"),
                           fingerprint())
