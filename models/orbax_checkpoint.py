"""Orbax checkpoints of our own param pytree, written by `jaxinfer convert`.

A converted model is a folder with ``config.json`` (HF-style), the
tokenizer's files, and ``params/`` (an orbax checkpoint of the params in our
layout, in the dtype chosen at conversion). Loading skips every per-tensor
conversion and restores each array straight into its final sharding, which
makes it the fastest way to start a large model.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from flax import linen as nn

from .abstract import abstract_variables
from .config import ModelConfig
from .errors import CheckpointError, MissingWeightError, ShapeMismatchError

PARAMS_DIR = "params"


def is_orbax_model(path: str) -> bool:
    return os.path.isdir(os.path.join(path, PARAMS_DIR))


def save_params(params: dict, path: str) -> None:
    import orbax.checkpoint as ocp
    target = os.path.join(os.path.abspath(path), PARAMS_DIR)
    if os.path.exists(target):
        raise CheckpointError(f"{target} already exists: choose an empty output "
                              "folder")
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(target, params)
    ckptr.wait_until_finished()


def restore_params(path: str, model: nn.Module, cfg: ModelConfig,
                   dtype: jax.typing.DTypeLike, shardings: Any = None) -> dict:
    """Params restored into ``shardings`` (a tree like the params; None: the
    default device), cast to ``dtype`` (quantized layers' codes and scales
    keep theirs)."""
    import orbax.checkpoint as ocp
    abstract = nn.unbox(abstract_variables(model, cfg)["params"])
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree_util.tree_map(lambda _: device, abstract)
    if cfg.fused_qkv:
        # `jaxinfer convert` writes q, k and v apart, as checkpoints hold
        # them: restored so, then joined on device (fused_qkv.py).
        from .fused_qkv import fuse_params, separate_shardings
        stored = dataclasses.replace(cfg, fused_qkv=False)
        params = restore_params(path, model.clone(cfg=stored), stored, dtype,
                                separate_shardings(shardings))
        return fuse_params(params, shardings)
    # Quantized layers' params keep their own dtypes (codes, scales).
    target = jax.tree_util.tree_map_with_path(
        lambda p, a, s: jax.ShapeDtypeStruct(
            a.shape, a.dtype if _is_quantized(p) else dtype, sharding=s),
        abstract, shardings)
    source = os.path.join(os.path.abspath(path), PARAMS_DIR)
    ckptr = ocp.StandardCheckpointer()
    _check_shapes(ckptr, source, abstract)
    try:
        return ckptr.restore(source, target)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise CheckpointError(f"{source} does not hold params for this "
                              f"config.json ({cfg.architecture}): {e}") from e


def _is_quantized(path: tuple) -> bool:
    from .quantization.methods import PARAM_NAMES
    return getattr(path[-1], "key", None) in PARAM_NAMES


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p): tuple(x.shape) for p, x in leaves}


def _check_shapes(ckptr: Any, source: str, abstract: Any) -> None:
    """Names the first missing or mis-shaped param before orbax reads any
    bytes (its own errors surface from background reads, far less clearly)."""
    try:
        meta = ckptr.metadata(source)
    except FileNotFoundError as e:
        raise CheckpointError(f"{source} is not an orbax checkpoint: {e}") from e
    tree = getattr(meta, "item_metadata", meta)
    saved = _shapes(getattr(tree, "tree", tree))
    for name, shape in _shapes(abstract).items():
        if name not in saved:
            raise MissingWeightError(f"{source}: param {name} is missing")
        if saved[name] != shape:
            raise ShapeMismatchError(
                f"{source}: param {name} has shape {saved[name]}, but "
                f"config.json implies {shape}")
