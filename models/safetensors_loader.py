"""HF safetensors folders: one ``model.safetensors`` or a sharded set listed in
``model.safetensors.index.json``. Tensors are read lazily, one at a time."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from safetensors import safe_open

from .errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class SafetensorsReader:
    """``get(name)`` over every safetensors file of a folder."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self._handles: dict[str, object] = {}
        index = os.path.join(model_dir, INDEX_FILE)
        if os.path.isfile(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(
                    f"{index} is malformed (needs a 'weight_map'): {e}") from e
            self._file_of = {k: os.path.join(model_dir, v)
                             for k, v in weight_map.items()}
        else:
            files = sorted(f for f in os.listdir(model_dir)
                           if f.endswith(".safetensors"))
            if not files:
                raise CheckpointError(
                    f"{model_dir} holds no *.safetensors file and no {INDEX_FILE}")
            self._file_of = {}
            for name in files:
                for key in self._open(os.path.join(model_dir, name)).keys():
                    self._file_of[key] = os.path.join(model_dir, name)
        missing = sorted({p for p in self._file_of.values()
                          if not os.path.isfile(p)})
        if missing:
            raise CheckpointError(f"{INDEX_FILE} names shard files that do not "
                                  f"exist: {', '.join(missing)}")

    def _open(self, path: str) -> Any:
        if path not in self._handles:
            try:
                # "flax" gives arrays that keep bfloat16 (NumPy cannot).
                self._handles[path] = safe_open(path, framework="flax")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{path} is not a readable safetensors "
                                      f"file: {e}") from e
        return self._handles[path]

    def names(self) -> list[str]:
        return list(self._file_of)

    def get(self, name: str) -> np.ndarray | None:
        path = self._file_of.get(name)
        if path is None:
            return None
        handle = self._open(path)
        if hasattr(handle, "get_slice") and handle.get_slice(
                name).get_dtype() in _RAW_DTYPES:
            return _read_raw(path, name)
        return np.asarray(handle.get_tensor(name))


# Dtypes safetensors' own readers cannot hand to NumPy (fp8 checkpoints):
# read from the file's bytes as ml_dtypes arrays.
_RAW_DTYPES = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _read_raw(path: str, name: str) -> np.ndarray:
    """One tensor from a safetensors file by its header (8-byte little-endian
    header size, a JSON header of dtype / shape / data_offsets, the data)."""
    import ml_dtypes
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(size))[name]
        start, end = entry["data_offsets"]
        f.seek(8 + size + start)
        data = f.read(end - start)
    dtype = getattr(ml_dtypes, _RAW_DTYPES[entry["dtype"]])
    return np.frombuffer(data, dtype).reshape(entry["shape"])
