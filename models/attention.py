"""The one attention interface between models and kernels.

A layer hands over this step's q/k/v and its page pair; this module writes the
new K/V into the pages and runs ragged paged attention with the backend chosen
once for the engine. Layers never import a kernel themselves.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jaxinfer.pallas_kernels import kv_cache
from jaxinfer.pallas_kernels.ragged_paged_attention_reference import (
    ragged_paged_attention_reference,
)

# "pallas": the Pallas kernels with the backend ragged_paged_attention picks
# (Mosaic GPU on Hopper for the cases it takes, else the Triton lowering);
# "pallas_triton": the Triton-lowered kernels only; "pallas_interpret": the
# kernels interpreted (CPU tests).
BACKENDS = ("reference", "pallas", "pallas_triton", "pallas_interpret")
# The engine's GPU default: the Mosaic GPU kernels on Hopper for the cases
# they take, Triton for the rest (the faster of the two wherever both run;
# benchmarks/kernels/bench_attention.py compares them).
GPU_DEFAULT_BACKEND = "pallas"

# A step's input array: NumPy where the host lays out the step, a jax array
# inside the jitted step.
StepArray = jax.Array | np.ndarray


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["slot_mapping", "block_tables", "kv_lens",
                                "cu_q_lens", "num_seqs"],
                   meta_fields=["decode_only", "max_q_len"])
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's tokens live in the page pool. All int32, padded to
    the step's buckets (T tokens, S sequences, P pages per sequence)."""
    slot_mapping: StepArray  # [T] slot each new token's K/V is written to; padding -> null page
    block_tables: StepArray  # [S, P] page ids of each sequence; padding -> null page
    kv_lens: StepArray  # [S] tokens in each sequence's pages after this step's write
    cu_q_lens: StepArray  # [S + 1] token rows of sequence s: cu_q_lens[s]:cu_q_lens[s+1]
    num_seqs: StepArray  # [1] real sequences; rows S beyond are padding
    # Static: every real sequence has one new token (a decode-only step), so
    # the Pallas kernels run the decode kernel alone. Part of the step's
    # compile key, like the bucket shape.
    decode_only: bool = False
    # Static: > 1 when every real sequence brings at most this many tokens
    # (a speculative verifying step), which the kernels serve as decodes.
    max_q_len: int = 0


def resolve_backend(backend: str | None) -> str:
    """`None` means: Pallas kernels on GPU (GPU_DEFAULT_BACKEND), the jnp
    reference elsewhere."""
    if backend is None:
        return (GPU_DEFAULT_BACKEND if jax.default_backend() == "gpu"
                else "reference")
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    return backend


def _attention_fn(backend: str) -> Callable[..., jax.Array]:
    if backend == "reference":
        return ragged_paged_attention_reference
    try:
        from jaxinfer.pallas_kernels import ragged_paged_attention
    except ImportError as e:  # pragma: no cover - kernel module absent
        raise ValueError(f"attention backend {backend!r} is unavailable: {e}") from e
    if backend == "pallas_interpret":
        return functools.partial(ragged_paged_attention, interpret=True)
    if backend == "pallas_triton":
        return functools.partial(_triton_only, ragged_paged_attention)
    return ragged_paged_attention


def _triton_only(kernel: Callable[..., jax.Array], q: jax.Array,
                 k_pages: jax.Array, *args: Any, **kw: Any) -> jax.Array:
    """The kernel with its tuned table, both halves on the Triton lowering."""
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import default_tuning
    tuning = dataclasses.replace(
        default_tuning(q.shape[-1], k_pages.shape[2]),
        decode_backend="triton", prefill_backend="triton")
    return kernel(q, k_pages, *args, tuning=tuning, **kw)


def paged_attention(
    q: jax.Array,  # [T, N, H]
    k: jax.Array,  # [T, K, H]
    v: jax.Array,  # [T, K, H]
    # ([K, num_pages, B, H], same), and for fp8 pages their per-page
    # scales ([K, num_pages] f32, same)
    kv: tuple[jax.Array, ...],
    md: AttentionMetadata,
    *,
    backend: str,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    mesh: Mesh | None = None,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """Writes k/v at ``md.slot_mapping`` then attends; returns (out [T, N, H],
    the updated pages laid out as ``kv``). ``mesh``: the tensor-parallel
    mesh, under which the Pallas kernels run per shard (the reference is
    left to XLA's SPMD partitioner). A page quadruple (fp8 pages + scales)
    is written with per-page scales, which the kernels read beside the
    pages."""
    slots, tables, kv_lens, cu, num_seqs = (
        jnp.asarray(a) for a in (md.slot_mapping, md.block_tables, md.kv_lens,
                                 md.cu_q_lens, md.num_seqs))
    if len(kv) == 4:
        bound = kv_cache.pages_touched_bound(
            k.shape[0], tables.shape[0], kv[0].shape[2])
        kv = kv_cache.write_kv_scaled(*kv, k, v, slots, bound)
    else:
        kv = kv_cache.write_kv(kv[0], kv[1], k, v, slots)
    attn = functools.partial(_attention_fn(backend), sm_scale=sm_scale,
                             sliding_window=sliding_window,
                             logit_soft_cap=logit_soft_cap,
                             decode_only=md.decode_only,
                             max_q_len=md.max_q_len)

    def fn(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
           kv_lens: jax.Array, tables: jax.Array, cu: jax.Array,
           num_seqs: jax.Array, *scales: jax.Array) -> jax.Array:
        kw = dict(zip(("k_scale", "v_scale"), scales))
        return attn(q, k_pages, v_pages, kv_lens, tables, cu, num_seqs, **kw)

    if backend != "reference" and mesh is not None:
        if _splits_heads(mesh, kv[0].shape[0]):
            fn = _per_shard(fn, mesh, len(kv) - 2)
    out = fn(q, kv[0], kv[1], kv_lens, tables, cu, num_seqs, *kv[2:])
    return out, kv


def _splits_heads(mesh: Mesh, num_kv_heads: int) -> bool:
    """True when tensor parallelism splits the kv heads (and so the pages)."""
    if "model" not in mesh.shape or mesh.shape["model"] == 1:
        return False
    return num_kv_heads % mesh.shape["model"] == 0


def _per_shard(fn: Callable[..., jax.Array], mesh: Mesh, num_scales: int = 0
               ) -> Callable[..., jax.Array]:
    """Runs a Pallas kernel once per model-axis shard on its own heads.

    XLA cannot partition a custom kernel call, so under tensor parallelism
    each device calls it on its slice of query heads and the matching kv
    heads (GQA groups never straddle a shard, since both head counts divide
    evenly); the metadata is replicated.
    """
    heads = PartitionSpec(None, "model", None)
    pages = PartitionSpec("model")
    rep = PartitionSpec()
    # Per-page scales [K, num_pages] split on kv heads like the pages.
    in_specs = (heads, pages, pages, rep, rep, rep, rep) + (pages,) * num_scales
    if hasattr(jax, "shard_map"):  # jax >= 0.7
        context = jax.sharding.get_abstract_mesh()
        if not context.empty and context.manual_axes:
            # Inside another shard_map (pipeline stages, manual over
            # "stage"): nest on the context's mesh, manual over "model" too.
            return jax.shard_map(fn, mesh=context, in_specs=in_specs,
                                 out_specs=heads, check_vma=False,
                                 axis_names={"model"})
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                             out_specs=heads, check_vma=False)
    from jax.experimental.shard_map import shard_map  # pragma: no cover
    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=heads,
                     check_rep=False)
