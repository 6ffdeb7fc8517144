"""Every process of a multi-process engine must be started with the same
configuration: a process with another model, dtype or size would compile
another program and the collectives would hang or corrupt. The processes
compare their settings at start (``process_allgather``, through JAX) and all
raise the same error naming what differs, on which process."""

from __future__ import annotations

import dataclasses
import zlib
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.experimental import multihost_utils

from ..errors import InvalidConfigError

if TYPE_CHECKING:
    from ..config import EngineArgs

# Settings that may differ from process to process.
LOCAL_FIELDS = frozenset({"process_id", "compilation_cache_dir",
                          "profile_steps"})
_SLOTS = 128  # digests compared at once (fields past this share the last)
_SHOWN = 160  # bytes of each differing value shown in the error


def settings(args: EngineArgs) -> dict[str, str]:
    """What must agree: the EngineArgs fields (but LOCAL_FIELDS) and the
    runtime (versions, platform, devices per process)."""
    out = {f.name: repr(getattr(args, f.name))
           for f in dataclasses.fields(args) if f.name not in LOCAL_FIELDS}
    # A default and the value it stands for are the same setting.
    out["warmup"] = repr(args.resolved_warmup(jax.default_backend()))
    from .. import __version__
    out.update({"jaxinfer version": __version__, "jax version": jax.__version__,
                "platform": jax.default_backend(),
                "local devices": str(jax.local_device_count())})
    return out


def _digest(text: str) -> int:
    return zlib.crc32(text.encode())


def check_same_config(args: EngineArgs) -> None:
    """Raises InvalidConfigError on every process when any two disagree."""
    values = settings(args)
    names = sorted(values)
    digests = np.zeros(_SLOTS, np.int64)
    digests[0] = _digest(",".join(names))  # the same list of settings
    for i, name in enumerate(names):
        digests[min(i + 1, _SLOTS - 1)] ^= _digest(f"{name}={values[name]}")
    every = np.asarray(multihost_utils.process_allgather(digests))
    if (every == every[0]).all():
        return
    if (every[:, 0] != every[0, 0]).any():
        raise InvalidConfigError(
            "the processes run different jaxinfer versions (their engine "
            "arguments differ in name): install the same version everywhere")
    differ = [name for i, name in enumerate(names)
              if (every[:, min(i + 1, _SLOTS - 1)] !=
                  every[0, min(i + 1, _SLOTS - 1)]).any()]
    lines = []
    for name in differ:
        raw = np.zeros(_SHOWN, np.uint8)
        text = values[name].encode()[:_SHOWN]
        raw[:len(text)] = np.frombuffer(text, np.uint8)
        shown = np.asarray(multihost_utils.process_allgather(raw))
        per_process = ", ".join(f"process {p}: {_text(row)}"
                                for p, row in enumerate(shown))
        lines.append(f"{name} ({per_process})")
    raise InvalidConfigError(
        "the processes of one engine must be started with the same "
        "settings (only --process-id differs), but they disagree on "
        + "; ".join(lines))


def _text(row: np.ndarray) -> str:
    return bytes(row).rstrip(b"\0").decode(errors="replace")
