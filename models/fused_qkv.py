"""q, k and v as one weight: one product per layer where there were three
(vLLM's ``QKVParallelLinear`` idea).

On the GPU, XLA joins three products that read one input into one GEMM
(its dot merger), but then concatenates the three weights inside that GEMM
at every step; a weight stored joined at load is read as it is.

Layout. The kernel is [D, K, G + 2, H] (K kv heads, G = N // K query heads
per kv head): along axis 2, the G query heads of kv head k (query head
``n = k * G + j``, HF's grouping of query heads onto kv heads), then k's
key, then its value; the bias (``attention_bias``) is [K, G + 2, H]. The
logical axes are ("embed", "kv_heads", "qkv_group", "head_dim"): tensor
parallelism splits the kv heads, so each shard holds whole groups, which
are the query heads that paged attention's per-shard kernel runs beside
that shard's kv heads; no shard reorders anything. ``qkv_group`` maps to
no mesh axis. Where the kv heads do not divide the model axis, the rules
would replicate the whole weight (the query heads too), so the layer stays
separate there (``fusable``).

Loading. Checkpoints store q, k and v apart (Phi-3: one tensor of q, then
k, then v rows); the weight list names the fused param with the tensors it
is joined from (``spec.JoinedTensors``), and the loader joins them on the
host, one layer at a time, before placing the result in its sharding. The
joined tensor is in HF layout with its rows in our order, so its
conversion is a plain ``LinearLayout`` and quantizing it at load (fp8 with
per-channel scales) quantizes each row as the separate layers would. The
GGUF weight cache keeps the checkpoint's own tensors, which either layout
reads; an orbax checkpoint (``jaxinfer convert``) holds the separate
params, joined on device after restoring (``fuse_params``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .config import ModelConfig
from .spec import JoinedTensors, WeightSpec, linear_from_hf, reshape_to

QKV_GROUP = "qkv_group"  # the logical axis of G query heads, k, v
KERNEL_AXES = ("embed", "kv_heads", QKV_GROUP, "head_dim")
# Platforms where the engine fuses by default. On CPU the joined product
# measured no faster (docs/performance.md, "CPU"); tests add "cpu".
DEFAULT_PLATFORMS = ("gpu",)
SEPARATE = ("q_proj", "k_proj", "v_proj")
FUSED = "qkv_proj"


def group_shape(cfg: ModelConfig) -> tuple[int, int, int]:
    """(K, G + 2, H): the fused product's output shape."""
    K = cfg.num_kv_heads
    return K, cfg.num_heads // K + 2, cfg.head_dim


def split(qkv: jax.Array, num_heads: int
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[T, K, G + 2, H] -> q [T, N, H], k [T, K, H], v [T, K, H]."""
    G = num_heads // qkv.shape[-3]
    q = qkv[..., :G, :].reshape(*qkv.shape[:-3], num_heads, qkv.shape[-1])
    return q, qkv[..., G, :], qkv[..., G + 1, :]


# -- loading ----------------------------------------------------------------

def _grouped_rows(K: int, H: int, q: np.ndarray, k: np.ndarray,
                  v: np.ndarray) -> np.ndarray:
    """HF rows q [N * H, ...], k and v [K * H, ...] -> [K * (G + 2) * H,
    ...]: per kv head its G query heads' rows, its k rows, its v rows."""
    rest = q.shape[1:]
    G = q.shape[0] // (K * H)
    return np.concatenate(
        [np.asarray(q).reshape(K, G, H, *rest),
         np.asarray(k).reshape(K, 1, H, *rest),
         np.asarray(v).reshape(K, 1, H, *rest)], axis=1).reshape(-1, *rest)


def _join_separate(K: int, H: int, arrays: Sequence[np.ndarray]) -> np.ndarray:
    q, k, v = arrays
    return _grouped_rows(K, H, q, k, v)


def _join_stored(K: int, H: int, N: int, arrays: Sequence[np.ndarray]
                 ) -> np.ndarray:
    """One stored tensor of q, then k, then v rows (Phi-3's qkv_proj)."""
    (w,) = arrays
    w = np.asarray(w)
    return _grouped_rows(K, H, w[:N * H], w[N * H:(N + K) * H],
                         w[(N + K) * H:])


def qkv_specs(cfg: ModelConfig, hf: str, path: tuple[str, ...],
              stored: str | None = None) -> Iterator[WeightSpec]:
    """The fused weight (and bias) of one attention layer under ``hf``
    (``model.layers.0.self_attn.``) and ``path``: joined from the
    checkpoint's q_proj, k_proj and v_proj, or cut from its one ``stored``
    tensor of q, k and v rows (a name under ``hf``)."""
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out = group_shape(cfg)
    rows = (N + 2 * K) * H
    if stored is None:
        joined = JoinedTensors(
            tuple(hf + f"{name}.weight" for name in SEPARATE),
            ((N * H, D), (K * H, D), (K * H, D)),
            functools.partial(_join_separate, K, H))
    else:
        joined = JoinedTensors((hf + stored,), ((rows, D),),
                               functools.partial(_join_stored, K, H, N))
    yield WeightSpec(hf + f"{FUSED}.weight", path + (FUSED, "kernel"),
                     (rows, D), linear_from_hf(out, (D,)), joined=joined)
    if cfg.attention_bias:
        if stored is not None:
            raise ValueError("a stored q/k/v tensor with a bias is not laid "
                             "out here")
        yield WeightSpec(
            hf + f"{FUSED}.bias", path + (FUSED, "bias"), (rows,),
            reshape_to(out),
            joined=JoinedTensors(
                tuple(hf + f"{name}.bias" for name in SEPARATE),
                ((N * H,), (K * H,), (K * H,)),
                functools.partial(_join_separate, K, H)))


# -- when it applies --------------------------------------------------------

def fusable(cfg: ModelConfig, tensor_parallel_size: int = 1,
            lora: bool = False) -> bool:
    """Whether ``cfg`` may run with one q/k/v weight: its family's weight
    list lays one out; no LoRA (adapters wrap q_proj, k_proj and v_proj by
    name); the kv heads split evenly over the model axis (otherwise the
    rules would replicate the query heads too); and the weights are float,
    or quantized at load to fp8 with per-channel scales (each output row
    then gets the scale it gets in its own layer, and the per-token
    activation scales read the shared input alike). Other quantized
    layouts are read from checkpoints layer by layer and stay separate."""
    from .quantization.methods import Fp8Weights
    from .registry import model_spec
    if lora or not model_spec(cfg.architecture).fuses_qkv:
        return False
    if tensor_parallel_size > 1 and cfg.num_kv_heads % tensor_parallel_size:
        return False
    q = cfg.quantization
    return q is None or (q.checkpoint_format == "float" and not q.overrides
                         and isinstance(q.scheme, Fp8Weights)
                         and q.scheme.per_channel)


def with_fused_qkv(cfg: ModelConfig, platform: str,
                   tensor_parallel_size: int = 1, lora: bool = False
                   ) -> ModelConfig:
    """``cfg`` with ``fused_qkv`` on where it applies (``fusable``) on a
    platform of DEFAULT_PLATFORMS; as it is otherwise."""
    if (platform not in DEFAULT_PLATFORMS or cfg.fused_qkv
            or not fusable(cfg, tensor_parallel_size, lora)):
        return cfg
    return dataclasses.replace(cfg, fused_qkv=True)


# -- params restored in the separate layout (orbax) -------------------------

# A fused param's group axis (G + 2), counted from the end: its kv heads
# come before it and H after; the fp8 codes [*out, In] end with In.
_GROUP_AXIS = {"kernel": -2, "bias": -2, "weight": -3, "weight_scale": -2}
_RANK = {"kernel": 4, "bias": 3, "weight": 4, "weight_scale": 3}


def separate_shardings(shardings: Any) -> Any:
    """The shardings tree of a fused model's params with each fused q/k/v
    param's sharding given to q_proj, k_proj and v_proj instead (the same
    mesh and split of kv heads, which the query heads follow)."""
    if not isinstance(shardings, dict):
        return shardings
    out = {k: separate_shardings(v) for k, v in shardings.items()
           if k != FUSED}
    if FUSED in shardings:
        for name in SEPARATE:
            out[name] = {p: _without_group_axis(s, p)
                         for p, s in shardings[FUSED].items()}
    return out


def _without_group_axis(s: Any, param: str) -> Any:
    """A fused param's sharding -> that of a separate one (the group axis
    dropped); one device's sharding as it is."""
    if not isinstance(s, NamedSharding):
        return s
    rank, axis = _RANK[param], _GROUP_AXIS[param]
    axes = list(tuple(s.spec) + (None,) * (rank - len(s.spec)))
    del axes[axis]
    return NamedSharding(s.mesh, PartitionSpec(*axes))


def fuse_params(params: Any, shardings: Any) -> Any:
    """Separate q/k/v params -> the fused ones, joined on device into their
    ``shardings`` (the fused model's tree; None leaves: the default
    device), one layer at a time. Consumes ``params``: each layer's
    separate arrays are dropped from it as the layer is joined, so at most
    one layer is held twice."""
    joins: dict[Any, Any] = {}  # one compiled join per target

    def join(param: str, sharding: Any, *qkv: jax.Array) -> jax.Array:
        key = (param, sharding)
        if key not in joins:
            joins[key] = jax.jit(
                functools.partial(_join, axis=_GROUP_AXIS[param]),
                out_shardings=sharding)
        return joins[key](*qkv)

    def walk(node: Any, target: Any) -> Any:
        if not isinstance(node, dict):
            return node
        fuse = isinstance(target, dict) and FUSED in target and all(
            name in node for name in SEPARATE)
        out = {k: walk(v, target[k]) for k, v in node.items()
               if not (fuse and k in SEPARATE)}
        if fuse:
            out[FUSED] = {p: join(p, s, *(node[n].pop(p) for n in SEPARATE))
                          for p, s in target[FUSED].items()}
        return out
    return walk(params, shardings)


def _join(q: jax.Array, k: jax.Array, v: jax.Array, axis: int) -> jax.Array:
    """q with N heads at ``axis``, k and v with K there -> G + 2 at
    ``axis`` after K (kernel [D, N, H] -> [D, K, G + 2, H])."""
    K = k.shape[axis]
    q = q.reshape(*q.shape[:axis], K, q.shape[axis] // K,
                  *q.shape[axis + 1:])
    return jnp.concatenate([q, jnp.expand_dims(k, axis),
                            jnp.expand_dims(v, axis)], axis=axis)
