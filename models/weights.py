"""HF tensor names -> our param pytree, shared by every checkpoint format.

A loader only has to answer ``get(hf_name) -> np.ndarray | None``; the
architecture's spec (``spec.py``, defined beside its model) lists the tensors
it needs and how each is laid out in our params (HF stores Linear weights as
[out, in]; we store [in, out] with heads split). This module fetches them and
checks every shape against the config, so a missing tensor or a wrong shape
is a typed error naming the tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np

from .config import ModelConfig
from .errors import MissingWeightError, ShapeMismatchError
from .spec import WeightSpec

TensorGetter = Callable[[str], "np.ndarray | None"]


def weight_specs(cfg: ModelConfig) -> Iterator[WeightSpec]:
    """Every checkpoint tensor of the config's architecture (its spec's
    list)."""
    from .registry import model_spec
    return iter(model_spec(cfg.architecture).weights(cfg))


def param_dtype(spec: WeightSpec, array: np.ndarray, dtype: Any) -> Any:
    """The dtype a tensor is placed in: the spec's own if it names one; else
    the model's ``dtype`` for floating tensors, and the stored dtype for
    any other (integer or packed quantized data is never cast)."""
    if spec.dtype is not None:
        return spec.dtype
    if jnp.issubdtype(array.dtype, jnp.floating):
        return dtype
    return array.dtype


def build_params(cfg: ModelConfig, get: TensorGetter, dtype: Any, source: str,
                 place: Callable | None = None,
                 elsewhere: Callable | None = None,
                 linear: Callable | None = None) -> dict:
    """Fetches, checks, converts and places every tensor, one at a time (so
    peak host memory is one tensor, not the checkpoint).

    ``place(path, array, dtype)`` puts a converted array on device in
    ``dtype`` (e.g. into its final sharding); by default ``jnp.asarray``.
    The dtype is ``param_dtype``'s: floating tensors in the model's, others
    as stored. ``elsewhere(path)``: a stand-in for a param none of this
    process's devices hold (a pipeline stage on another host), which is
    then never read; None to load it. ``linear(spec, get, source)``
    (quantization/loading.py) may answer a linear layer's weight with the
    params of its quantized method.
    """
    params: dict = {}

    def put(path: tuple[str, ...], arr: np.ndarray, target: Any) -> None:
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = (place(path, arr, target) if place else
                          jnp.asarray(arr, dtype=target))

    for spec in weight_specs(cfg):
        spec_get = (get if spec.joined is None else
                    _joining(spec, get, source, cfg.architecture))
        if linear is not None:
            # A quantized linear layer: its params in their own dtypes.
            items = linear(spec, spec_get, source)
            if items is not None:
                for path, arr in items:
                    put(path, arr, arr.dtype)
                continue
        hf_name, path = spec.hf_name, spec.path
        stand_in = elsewhere(path) if elsewhere is not None else None
        if stand_in is not None:
            node = params
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = stand_in
            continue
        w = spec_get(hf_name)
        for alias in spec.aliases:
            if w is not None:
                break
            w = get(alias)
        if w is None and spec.parts:
            w = _stacked(spec, get, source, cfg.architecture)
        check_shape(spec, w, source, cfg.architecture)
        arr = spec.convert(w)
        put(path, arr, param_dtype(spec, arr, dtype))
    return params


def check_shape(spec: WeightSpec, w: np.ndarray | None, source: str,
                architecture: str) -> None:
    """A typed error naming the tensor when it is missing (``w`` None) or
    its shape is not the one the config implies."""
    if w is None:
        also = (f" (nor under {', '.join(map(repr, spec.aliases))})"
                if spec.aliases else "")
        raise MissingWeightError(
            f"{source}: tensor {spec.hf_name!r} is missing{also} (needed by "
            f"{architecture} with this config)")
    if tuple(w.shape) != tuple(spec.hf_shape):
        raise ShapeMismatchError(
            f"{source}: tensor {spec.hf_name!r} has shape {tuple(w.shape)}, "
            f"but the config implies {tuple(spec.hf_shape)}")


def checkpoint_names(spec: WeightSpec) -> tuple[str, ...]:
    """The checkpoint tensors a spec reads by name: those it is joined
    from, else its own (aliases and stacked parts aside)."""
    return spec.joined.names if spec.joined is not None else (spec.hf_name,)


def _joining(spec: WeightSpec, get: TensorGetter, source: str,
             architecture: str) -> TensorGetter:
    """``get`` that answers ``spec.hf_name`` with the tensor joined from
    ``spec.joined``'s (each checked as its own tensor), so the plain and
    the quantized paths read it alike."""
    joined = spec.joined
    assert joined is not None

    def read(name: str) -> np.ndarray | None:
        if name != spec.hf_name:
            return get(name)
        arrays = []
        for part, shape in zip(joined.names, joined.shapes):
            w = get(part)
            check_shape(WeightSpec(part, spec.path, shape), w, source,
                        architecture)
            assert w is not None  # check_shape raised for a missing one
            arrays.append(w)
        return joined.join(arrays)
    return read


def _stacked(spec: WeightSpec, get: TensorGetter, source: str,
             architecture: str) -> np.ndarray | None:
    """``spec.parts`` stacked on a new first axis; None when the checkpoint
    has none of them (then ``spec.hf_name`` is reported missing)."""
    arrays = [get(name) for name in spec.parts]
    if all(a is None for a in arrays):
        return None
    for name, a in zip(spec.parts, arrays):
        if a is None:
            raise MissingWeightError(
                f"{source}: tensor {name!r} is missing (needed by "
                f"{architecture} with this config)")
        if tuple(a.shape) != tuple(spec.hf_shape[1:]):
            raise ShapeMismatchError(
                f"{source}: tensor {name!r} has shape {tuple(a.shape)}, "
                f"but the config implies {tuple(spec.hf_shape[1:])}")
    return np.stack([a for a in arrays if a is not None])
