"""The one attention interface between models and kernels.

A layer hands over this step's q/k/v and its page pair; this module writes the
new K/V into the pages and runs ragged paged attention with the backend chosen
once for the engine. Layers never import a kernel themselves. A layer that
hands over its RoPE rows (and q/k norm weights) gets those applied here too:
the Pallas backends run them with the write as one kernel
(``pallas_kernels/rope_write_kv.py``) wherever it takes the case.
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

from .layers import rms_norm
from .rope import apply_rope

# "pallas": the Pallas kernels with the backend ragged_paged_attention picks
# (Mosaic GPU on Hopper for the cases it takes, else the Triton lowering);
# "pallas_triton": the Triton-lowered kernels only; "pallas_interpret": the
# kernels interpreted (CPU tests). Each Pallas backend runs a layer's q/k
# norm, RoPE and K/V write as one kernel; "<backend>_xla_rope" runs the same
# attention kernels with those as XLA ops, as "reference" does (to compare).
XLA_ROPE = "_xla_rope"
# On the GPU the kernel runs for steps of at most this many token rows: on
# an H100 (decode-step-rope-qkv-h100.json, llama3-8b) it took one sequence's
# step (16 rows) from 7.60 to 6.95 ms, but a 256-row step from 20.30 to
# 20.59 ms, where XLA's fusions of the same work are wide enough to be
# cheap. Sizes between were not timed. The interpreted backend (CPU tests)
# runs it at every size.
ROPE_WRITE_MAX_TOKENS = 16
BACKENDS = ("reference", "pallas", "pallas_triton", "pallas_interpret",
            "pallas" + XLA_ROPE, "pallas_interpret" + XLA_ROPE)
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
    backend = backend.removesuffix(XLA_ROPE)
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
    cos_sin: jax.Array | None = None,  # [T, H] f32 RoPE rows (rope.py's table)
    qk_norm: tuple[jax.Array, jax.Array, float] | None = None,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """Writes k/v at ``md.slot_mapping`` then attends; returns (out [T, N, H],
    the updated pages laid out as ``kv``). ``mesh``: the tensor-parallel
    mesh, under which the Pallas kernels run per shard (the reference is
    left to XLA's SPMD partitioner). A page quadruple (fp8 pages + scales)
    is written with per-page scales, which the kernels read beside the
    pages.

    With ``cos_sin``, q and k arrive as projected: RoPE (HF's rotation over
    the whole head) is applied to both here, after an RMSNorm of each when
    ``qk_norm`` = (q weight [H], k weight [H], eps) is given."""
    slots, tables, kv_lens, cu, num_seqs = (
        jnp.asarray(a) for a in (md.slot_mapping, md.block_tables, md.kv_lens,
                                 md.cu_q_lens, md.num_seqs))
    if cos_sin is not None and _fused_prologue(backend, q, k, v, cos_sin, kv,
                                               qk_norm):
        q, kv = _rope_write_kv(q, k, v, cos_sin, kv, slots, qk_norm,
                               interpret=backend.startswith("pallas_interpret"),
                               mesh=mesh)
    else:
        if cos_sin is not None:
            if qk_norm is not None:
                q_w, k_w, eps = qk_norm
                q, k = rms_norm(q, q_w, eps), rms_norm(k, k_w, eps)
            q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
        if len(kv) == 4:
            bound = kv_cache.pages_touched_bound(
                k.shape[0], tables.shape[0], kv[0].shape[2])
            kv = kv_cache.write_kv_scaled(*kv, k, v, slots, bound)
        else:
            kv = kv_cache.write_kv(kv[0], kv[1], k, v, slots)
    return _attend(q, kv, md, kv_lens, tables, cu, num_seqs, backend=backend,
                   sm_scale=sm_scale, sliding_window=sliding_window,
                   logit_soft_cap=logit_soft_cap, mesh=mesh), kv


def _attend(q: jax.Array, kv: tuple[jax.Array, ...], md: AttentionMetadata,
            kv_lens: jax.Array, tables: jax.Array, cu: jax.Array,
            num_seqs: jax.Array, *, backend: str, sm_scale: float,
            sliding_window: int | None, logit_soft_cap: float | None,
            mesh: Mesh | None) -> jax.Array:
    """Ragged paged attention over pages already written."""
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
            # Per-page scales [K, num_pages] split on kv heads like the pages.
            in_specs = ((_HEADS, _PAGES, _PAGES, _REP, _REP, _REP, _REP)
                        + (_PAGES,) * (len(kv) - 2))
            fn = _per_shard(fn, mesh, in_specs, _HEADS)
    return fn(q, kv[0], kv[1], kv_lens, tables, cu, num_seqs, *kv[2:])


def _fused_prologue(backend: str, q: jax.Array, k: jax.Array, v: jax.Array,
                    cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                    qk_norm: tuple[jax.Array, jax.Array, float] | None) -> bool:
    """Whether rope_write_kv runs the norm, RoPE and write: on the Pallas
    backends, for 16-bit or f32 page pairs and the shapes it takes; on the
    GPU for steps of up to ROPE_WRITE_MAX_TOKENS token rows."""
    if backend == "reference" or backend.endswith(XLA_ROPE) or len(kv) != 2:
        return False
    if not backend.startswith("pallas_interpret") \
            and q.shape[0] > ROPE_WRITE_MAX_TOKENS:
        return False
    from jaxinfer.pallas_kernels.rope_write_kv import unsupported
    norms = qk_norm[:2] if qk_norm is not None else ()
    return unsupported(q, k, v, cos_sin, kv[0], kv[1], *norms) is None


def _rope_write_kv(q: jax.Array, k: jax.Array, v: jax.Array,
                   cos_sin: jax.Array, kv: tuple[jax.Array, ...],
                   slots: jax.Array,
                   qk_norm: tuple[jax.Array, jax.Array, float] | None, *,
                   interpret: bool, mesh: Mesh | None
                   ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """rope_write_kv, per model-axis shard when the kv heads split."""
    from jaxinfer.pallas_kernels.rope_write_kv import rope_write_kv
    norms, eps = (qk_norm[:2], qk_norm[2]) if qk_norm is not None else ((), 0.0)

    def fn(q: jax.Array, k: jax.Array, v: jax.Array, cos_sin: jax.Array,
           k_pages: jax.Array, v_pages: jax.Array, slots: jax.Array,
           *norms: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return rope_write_kv(q, k, v, cos_sin, k_pages, v_pages, slots,
                             *norms, eps=eps, interpret=interpret)

    if mesh is not None and _splits_heads(mesh, kv[0].shape[0]):
        in_specs = ((_HEADS, _HEADS, _HEADS, _REP, _PAGES, _PAGES, _REP)
                    + (_REP,) * len(norms))
        fn = _per_shard(fn, mesh, in_specs, (_HEADS, _PAGES, _PAGES))
    q, k_pages, v_pages = fn(q, k, v, cos_sin, kv[0], kv[1], slots, *norms)
    return q, (k_pages, v_pages)


def _splits_heads(mesh: Mesh, num_kv_heads: int) -> bool:
    """True when tensor parallelism splits the kv heads (and so the pages)."""
    if "model" not in mesh.shape or mesh.shape["model"] == 1:
        return False
    return num_kv_heads % mesh.shape["model"] == 0


# Specs of a kernel's arguments under tensor parallelism: [T, heads, H]
# rows split on heads, pages (and their scales) on kv heads, the rest
# replicated.
_HEADS = PartitionSpec(None, "model", None)
_PAGES = PartitionSpec("model")
_REP = PartitionSpec()


def _per_shard(fn: Callable[..., Any], mesh: Mesh, in_specs: tuple,
               out_specs: Any) -> Callable[..., Any]:
    """Runs a Pallas kernel once per model-axis shard on its own heads.

    XLA cannot partition a custom kernel call, so under tensor parallelism
    each device calls it on its slice of query heads and the matching kv
    heads (GQA groups never straddle a shard, since both head counts divide
    evenly); the metadata is replicated.
    """
    if hasattr(jax, "shard_map"):  # jax >= 0.7
        context = jax.sharding.get_abstract_mesh()
        if not context.empty and context.manual_axes:
            # Inside another shard_map (pipeline stages, manual over
            # "stage"): nest on the context's mesh, manual over "model" too.
            return jax.shard_map(fn, mesh=context, in_specs=in_specs,
                                 out_specs=out_specs, check_vma=False,
                                 axis_names={"model"})
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                             out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map  # pragma: no cover
    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                     check_rep=False)
