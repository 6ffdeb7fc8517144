"""Architectures by HF ``architectures`` name: one checked ``ModelSpec`` each.

``register_model`` refuses a spec whose module breaks the model contract
(``spec.py``) or whose names clash with a registered one, so a mistake in a
new family shows at import, not at a user's first request. The built-in
families register themselves below; a plugin calls ``register_model`` with
its own spec.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ModelConfigError
from .spec import ModelContractError, ModelSpec, check_spec

_SPECS: dict[str, ModelSpec] = {}
# (llama.cpp general.architecture, whether the file holds experts) -> spec:
# llama.cpp writes Mixtral under "llama", told apart by its expert count.
_GGUF: dict[tuple[str, bool], ModelSpec] = {}


def _gguf_key(spec: ModelSpec) -> tuple[str, bool]:
    assert spec.gguf is not None
    return spec.gguf.arch, spec.gguf.experts


def register_model(spec: ModelSpec) -> ModelSpec:
    check_spec(spec)
    if spec.architecture in _SPECS:
        raise ModelContractError(
            f"architecture {spec.architecture!r} is already registered (by "
            f"{_SPECS[spec.architecture].model.__name__})")
    if spec.gguf is not None and _gguf_key(spec) in _GGUF:
        raise ModelContractError(
            f"GGUF architecture {spec.gguf.arch!r}"
            f"{' with experts' if spec.gguf.experts else ''} is already "
            f"served by {_GGUF[_gguf_key(spec)].architecture}")
    _SPECS[spec.architecture] = spec
    if spec.gguf is not None:
        _GGUF[_gguf_key(spec)] = spec
    return spec


def unregister_model(architecture: str) -> None:
    """Removes a registered spec (plugins replacing one, tests)."""
    spec = _SPECS.pop(architecture)
    if spec.gguf is not None:
        _GGUF.pop(_gguf_key(spec), None)


def supported_architectures() -> list[str]:
    return sorted(_SPECS)


def supported_gguf_architectures() -> list[str]:
    return sorted(arch + (" (with experts)" if experts and (arch, False) in _GGUF
                          else "") for arch, experts in _GGUF)


def model_spec(architecture: str) -> ModelSpec:
    spec = _SPECS.get(architecture)
    if spec is None:
        raise ModelConfigError(
            f"unsupported architecture {architecture!r}; supported: "
            f"{', '.join(supported_architectures())}")
    return spec


def find_spec(architectures: Iterable[str], model_type: str | None = None
              ) -> ModelSpec:
    """The spec of the first registered name in an HF config's
    ``architectures`` list."""
    names = list(architectures)
    for name in names:
        if name in _SPECS:
            return _SPECS[name]
    raise ModelConfigError(
        f"unsupported architecture {names or model_type!r}; supported: "
        f"{', '.join(supported_architectures())}")


def gguf_spec(gguf_arch: str, experts: bool = False) -> ModelSpec | None:
    """The spec serving GGUF files of ``gguf_arch``; ``experts``: the file
    has a mixture of experts (``{arch}.expert_count`` above zero)."""
    return _GGUF.get((gguf_arch, experts))


def model_class(architecture: str) -> type:
    return model_spec(architecture).model


def _register_builtin() -> None:
    from . import gemma, llama, llava, mixtral, phi3, qwen3_moe
    for spec in (llama.SPECS + llava.SPECS + mixtral.SPECS + qwen3_moe.SPECS
                 + gemma.SPECS + phi3.SPECS):
        register_model(spec)


_register_builtin()
