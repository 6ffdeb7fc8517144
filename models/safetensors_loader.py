"""HF safetensors folders: one ``model.safetensors`` or a sharded set listed in
``model.safetensors.index.json``. Tensors are read lazily, one at a time."""

from __future__ import annotations

import json
import os

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

    def _open(self, path):
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

    def get(self, name: str):
        path = self._file_of.get(name)
        if path is None:
            return None
        return np.asarray(self._open(path).get_tensor(name))
