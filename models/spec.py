"""`ModelSpec`: everything the engine needs to know about one architecture.

A family file (``llama.py``) defines its Flax module and one spec per HF
``architectures`` name it serves; ``registry.py`` checks each spec at
registration. The loaders, the config parser and the parameter count read
the spec, so adding a family touches its own file (and the registry's list
of built-in families), not the loaders.

What a spec holds:

- ``config_from_hf``: HF ``config.json`` dict -> our ``ModelConfig``.
- ``weights``: for a config, every checkpoint tensor as a ``WeightSpec``
  (HF name, where it goes in our param pytree, its HF shape, the layout
  conversion). Shardings are not listed here: each param of the module
  declares logical axis names, and ``jaxinfer.sharding`` maps those.
- ``gguf``: llama.cpp's names for the same tensors (None: no GGUF files).
- ``num_params``: derived from ``weights`` unless a family says otherwise.

The module contract (checked by ``check_model_class``)::

    Model(cfg, backend=..., dtype=..., mesh=...)        # a flax.linen.Module
    Model.constants(max_model_len) -> {name: np.ndarray}  # e.g. RoPE tables
    model.apply({"params": p, "constants": c}, input_ids, positions,
                kv_pages, md, logits_indices, inputs_embeds=None)
        -> (logits [S, V] float32, kv_pages)

``models.runtime`` is the one place that makes that call.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import linen as nn

from .config import ModelConfig
from .errors import ModelConfigError


def keep_layout(w: Any) -> np.ndarray:
    """The identity conversion: the HF tensor is already in our layout."""
    return np.asarray(w)


@dataclasses.dataclass(frozen=True)
class LinearLayout:
    """The conversion of an HF Linear weight [out, in] to our kernel
    in_shape + out_shape; quantized loaders read the shapes from it to lay
    out a quantized layer's tensors (models/quantization/)."""
    out_shape: tuple[int, ...]
    in_shape: tuple[int, ...]

    def __call__(self, w: Any) -> np.ndarray:
        return np.asarray(w).T.reshape(*self.in_shape, *self.out_shape)


@dataclasses.dataclass(frozen=True)
class StackedExpertsLayout:
    """HF's per-expert Linear weights stacked [E, out, in] -> ours
    [E, in, out]; a quantized model's loader quantizes them from it
    (models/quantization/loading.py)."""

    def __call__(self, w: Any) -> np.ndarray:
        return np.asarray(w).transpose(0, 2, 1)


def linear_from_hf(out_shape: tuple[int, ...], in_shape: tuple[int, ...]
                   ) -> LinearLayout:
    """HF Linear weight [out, in] -> our kernel in_shape + out_shape."""
    return LinearLayout(tuple(out_shape), tuple(in_shape))


def reshape_to(shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    """A flat HF tensor (a bias, say) -> our ``shape``."""
    def convert(w: Any) -> np.ndarray:
        return np.asarray(w).reshape(shape)
    return convert


@dataclasses.dataclass(frozen=True)
class JoinedTensors:
    """Checkpoint tensors that make one tensor together (a layer's q, k and
    v for one fused weight): ``join`` takes them, read by ``names`` and
    checked against ``shapes`` (HF layout), and returns the joined tensor
    in HF layout, of its spec's ``hf_shape``."""
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    join: Callable[[Sequence[np.ndarray]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """One checkpoint tensor and where it lands in our params."""
    hf_name: str  # name in an HF safetensors checkpoint
    path: tuple[str, ...]  # keys into our param pytree
    hf_shape: tuple[int, ...]  # the shape the config implies, HF layout
    convert: Callable[[Any], Any] = keep_layout  # HF layout -> ours
    # The param's dtype: None casts a floating tensor to the model's dtype
    # and keeps any other (integer, packed quantized) tensor as stored.
    dtype: Any = None
    # Other names of the same tensor, tried in order when hf_name is absent
    # (checkpoints of one architecture saved by different transformers
    # versions name some tensors differently).
    aliases: tuple[str, ...] = ()
    # Tensors stacked on a new first axis to make this one (a mixture of
    # experts' per-expert weights), each of shape hf_shape[1:]; read when
    # the checkpoint holds no tensor named hf_name (GGUF stores them
    # stacked under one name).
    parts: tuple[str, ...] = ()
    # The checkpoint tensors this one is joined from; then ``hf_name``
    # names the joined tensor (a checkpoint tensor of that name, Phi-3's
    # rows of q, k and v, is read only as one of the joined ones).
    joined: JoinedTensors | None = None


@dataclasses.dataclass(frozen=True)
class GGUFNames:
    """How llama.cpp names and lays out a family's tensors."""
    arch: str  # the file's ``general.architecture`` value
    # blk.{i}.<key>.{weight,bias} -> model.layers.{i}.<value>.{weight,bias}
    layer_names: Mapping[str, str]
    # whole-model tensors: GGUF name -> HF name
    top_names: Mapping[str, str]
    # llama.cpp's converter permutes q/k rows for its interleaved rotary
    # layout in some architectures (Llama, Mistral) and not others (Qwen).
    permuted_qk: bool = False
    # HF config fields that llama.cpp hard-codes for the architecture and
    # so never writes to the file (Qwen3-MoE renormalises its top-k).
    config_defaults: Mapping[str, Any] = dataclasses.field(
        default_factory=dict)
    # The family's own metadata: (field getter of ``{arch}.<key>``, the
    # config built so far) -> more HF config fields (Gemma's soft caps).
    config_fields: Callable[[Callable[..., Any], dict], dict] | None = None
    # A stored convention undone on load: (HF name, array) -> array
    # (Gemma's norm weights, stored as 1 + w).
    from_stored: Callable[[str, np.ndarray], np.ndarray] | None = None
    # Serves the files of ``arch`` that hold a mixture of experts
    # (``{arch}.expert_count`` > 0): llama.cpp writes Mixtral as "llama".
    experts: bool = False


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    architecture: str  # the HF ``architectures`` name served
    model: type  # the flax.linen.Module subclass
    config_from_hf: Callable[[dict], ModelConfig]
    weights: Callable[[ModelConfig], Iterable[WeightSpec]]
    gguf: GGUFNames | None = None
    count_params: Callable[[ModelConfig], int] | None = None
    # ``weights`` honours ``ModelConfig.fused_qkv`` (its module is
    # llama.py's, whose Attention then holds one q/k/v weight).
    fuses_qkv: bool = False

    def num_params(self, cfg: ModelConfig) -> int:
        if self.count_params is not None:
            return self.count_params(cfg)
        return sum(math.prod(w.hf_shape) for w in self.weights(cfg))


# What every model's __call__ takes, in this order (see the module doc).
CALL_ARGS = ("input_ids", "positions", "kv_pages", "md", "logits_indices")
CALL_KWARGS = ("inputs_embeds",)
INIT_FIELDS = ("cfg", "backend", "dtype", "mesh")


class ModelContractError(TypeError):
    """A model class or spec that does not keep the contract above; raised
    at registration, naming what to change."""


def check_model_class(name: str, model: type) -> None:
    if not (isinstance(model, type) and issubclass(model, nn.Module)):
        raise ModelContractError(
            f"{name}: the model must be a flax.linen.Module subclass, got "
            f"{model!r}")
    fields = {f.name for f in dataclasses.fields(model)}
    missing = [f for f in INIT_FIELDS if f not in fields]
    if missing:
        raise ModelContractError(
            f"{name}: {model.__name__} lacks the field(s) {', '.join(missing)}"
            f"; a model is built as Model({', '.join(INIT_FIELDS)})")
    params = list(inspect.signature(model.__call__).parameters)[1:]
    if tuple(params[:len(CALL_ARGS)]) != CALL_ARGS or not set(
            CALL_KWARGS) <= set(params):
        raise ModelContractError(
            f"{name}: {model.__name__}.__call__ takes ({', '.join(params)}); "
            f"the contract is ({', '.join(CALL_ARGS)}, "
            f"{', '.join(k + '=None' for k in CALL_KWARGS)})")
    if not callable(getattr(model, "constants", None)):
        raise ModelContractError(
            f"{name}: {model.__name__} needs a constants(max_model_len) "
            "method returning its host-side tables (e.g. RoPE), "
            "{} when it has none")


def check_spec(spec: ModelSpec) -> None:
    if not isinstance(spec, ModelSpec):
        raise ModelContractError(f"register a ModelSpec, got {spec!r}")
    if not spec.architecture or not isinstance(spec.architecture, str):
        raise ModelContractError(
            f"a spec needs its HF architectures name, got {spec.architecture!r}")
    check_model_class(spec.architecture, spec.model)
    for field in ("config_from_hf", "weights"):
        if not callable(getattr(spec, field)):
            raise ModelContractError(
                f"{spec.architecture}: spec.{field} must be callable")


def verify_weights(spec: ModelSpec, cfg: ModelConfig, abstract_params: Any
                   ) -> None:
    """The spec's weights fill exactly the module's params, each with the
    shape the module declares (``abstract_params``: the unboxed params of
    ``abstract.abstract_variables``). For a family's tests: a weight list
    out of step with the module fails here, not at a user's first load."""
    import jax
    want = {tuple(getattr(k, "key", k) for k in path): leaf.shape
            for path, leaf in jax.tree_util.tree_flatten_with_path(
                abstract_params)[0]}
    got = {}
    for w in spec.weights(cfg):
        dummy = np.zeros(w.hf_shape, np.float32)
        got[w.path] = np.shape(w.convert(dummy))
    if set(got) != set(want):
        raise ModelConfigError(
            f"{spec.architecture}: weights and module params differ; only in "
            f"weights: {sorted(set(got) - set(want))}; only in the module: "
            f"{sorted(set(want) - set(got))}")
    for path, shape in got.items():
        if tuple(shape) != tuple(want[path]):
            raise ModelConfigError(
                f"{spec.architecture}: {'/'.join(path)} converts to {shape}, "
                f"the module declares {want[path]}")
