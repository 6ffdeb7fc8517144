"""A layer's work between the q/k/v projection and attention, as one kernel:
the optional q/k RMSNorm (Qwen3), RoPE on q and k, and the K/V write into the
page pool (``kv_cache.write_kv``'s slots and layout).

Why one kernel: at one decoding sequence each of these is a launch of a
couple of microseconds over a few kilobytes, once per layer; here a
program reads its tokens' rows of q, k, v and cos/sin once, and writes
the rotated q out and the rotated k and v straight into their slots of the
pages, which are aliased in place.

Grid ``(token tiles, K)``: program ``(i, h)`` takes ``block_tokens`` token
rows of kv head ``h``: its k and v rows and the rows of the ``G = N / K``
query heads of its GQA group. The last tile is shifted back to end at row
T (it recomputes rows of the tile before it and writes the same values), so
T needs no padding and no masks. Padding tokens, whose slots point at the
null page, write there like any other token.

RoPE is HF's non-interleaved rotation over the whole head (``rope.py``'s
table: ``[T, H]`` rows, cos in the first half and sin in the second, any
frequency scaling already in them). Rounding follows the XLA path: the
norm's result is cast to the activation dtype before its weight multiply
and again after it, RoPE runs in float32 and casts back to the activation
dtype, and the write casts to the pages' dtype. 16-bit and f32 pages only;
fp8 pages with per-page scales keep ``write_kv_scaled``.

Pallas' Triton lowering on GPU; ``interpret=True`` on CPU (tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .kernel_common import Ref, cdiv
from .kv_cache import write_kv

PAGE_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16),
               jnp.dtype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class RopeWriteTuning:
    block_tokens: int = 16  # token rows per program (fewer when T is smaller)
    num_warps: int = 4

    def __post_init__(self):
        for name in ("block_tokens", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"RopeWriteTuning.{name} must be a power of "
                                 f"two >= 1, got {value}")


def unsupported(q: jax.Array, k: jax.Array, v: jax.Array, cos_sin: jax.Array,
                k_pages: jax.Array, v_pages: jax.Array,
                q_norm: jax.Array | None = None,
                k_norm: jax.Array | None = None) -> str | None:
    """Why the kernel does not take these shapes and dtypes (the caller
    then runs the XLA path), or None when it does. Static: shapes only."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_tokens == 0:
        return "no tokens"
    if head_dim < 2 or head_dim & (head_dim - 1):
        return f"head dim {head_dim} is not a power of two (Triton's tensors)"
    if cos_sin.shape != (num_tokens, head_dim):
        return (f"cos/sin rows {cos_sin.shape} are not [T, H] = "
                f"{(num_tokens, head_dim)} (partial rotary)")
    if k.shape != v.shape or k.shape != (num_tokens, num_kv_heads, head_dim):
        return f"k {k.shape} and v {v.shape} do not match q {q.shape}"
    if num_heads % num_kv_heads:
        return f"{num_heads} query heads over {num_kv_heads} kv heads"
    if k_pages.shape != v_pages.shape or k_pages.shape[0] != num_kv_heads \
            or k_pages.shape[3] != head_dim:
        return f"pages {k_pages.shape}, {v_pages.shape} do not match k {k.shape}"
    for name, x in (("q", q), ("k", k), ("v", v), ("k pages", k_pages),
                    ("v pages", v_pages)):
        if jnp.dtype(x.dtype) not in PAGE_DTYPES:
            return f"{name} dtype {x.dtype}"
    if q.dtype != k.dtype:
        return f"q dtype {q.dtype} and k dtype {k.dtype} differ"
    if (q_norm is None) != (k_norm is None):
        return "only one of the q and k norms"
    for name, w, x in (("q", q_norm, q), ("k", k_norm, k)):
        if w is not None and (w.shape != (head_dim,) or w.dtype != x.dtype):
            # The XLA path would promote the activations to the weight's
            # dtype; the kernel keeps the activation dtype.
            return f"{name} norm weight {w.shape} {w.dtype} against {x.dtype}"
    return None


def rope_write_kv_kernel(
    slots_ref: Ref,  # [T] int32 slot of each token
    cos_sin_ref: Ref,  # [T, H] f32 cos | sin
    q_norm_ref: Ref,  # [H] RMSNorm weight of q (ones when unused)
    k_norm_ref: Ref,  # [H] RMSNorm weight of k
    q_ref: Ref,  # [T, G, H] this kv head's query heads
    k_ref: Ref,  # [T, H] this kv head
    v_ref: Ref,  # [T, H]
    k_pages_in_ref: Ref,  # [num_pages, B, H] aliased with k_pages_ref
    v_pages_in_ref: Ref,  # [num_pages, B, H] aliased with v_pages_ref
    q_out_ref: Ref,  # [T, G, H]
    k_pages_ref: Ref,  # [num_pages, B, H] this kv head's pages, written in place
    v_pages_ref: Ref,  # [num_pages, B, H]
    *, block_tokens: int, norm: bool, eps: float) -> None:
    del k_pages_in_ref, v_pages_in_ref
    num_tokens, group, head_dim = q_ref.shape
    half = head_dim // 2
    page_size = k_pages_ref.shape[1]
    start = jnp.minimum(pl.program_id(0) * block_tokens,
                        num_tokens - block_tokens)
    rows = pl.ds(start, block_tokens)
    lo, hi = pl.ds(0, half), pl.ds(half, half)
    cos, sin = cos_sin_ref[rows, lo], cos_sin_ref[rows, hi]

    def prologue(x1: jax.Array, x2: jax.Array, norm_ref: Ref
                 ) -> tuple[jax.Array, jax.Array]:
        """Two halves [bt, H/2] of a head's rows -> the rotated halves in
        the activation dtype."""
        dtype = x1.dtype
        x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
        if norm:
            ms = (jnp.sum(x1 * x1, axis=1) + jnp.sum(x2 * x2, axis=1)) / head_dim
            r = jax.lax.rsqrt(ms + eps)[:, None]

            def scaled(x: jax.Array, w: jax.Array) -> jax.Array:
                x = (x * r).astype(dtype).astype(jnp.float32)
                return (x * w.astype(jnp.float32)[None, :]).astype(
                    dtype).astype(jnp.float32)
            x1, x2 = scaled(x1, norm_ref[lo]), scaled(x2, norm_ref[hi])
        return ((x1 * cos - x2 * sin).astype(dtype),
                (x2 * cos + x1 * sin).astype(dtype))

    for g in range(group):
        y1, y2 = prologue(q_ref[rows, g, lo], q_ref[rows, g, hi], q_norm_ref)
        q_out_ref[rows, g, lo] = y1
        q_out_ref[rows, g, hi] = y2

    slots = slots_ref[rows]
    page, offset = slots // page_size, slots % page_size
    k1, k2 = prologue(k_ref[rows, lo], k_ref[rows, hi], k_norm_ref)
    k_pages_ref[page, offset, lo] = k1.astype(k_pages_ref.dtype)
    k_pages_ref[page, offset, hi] = k2.astype(k_pages_ref.dtype)
    v_pages_ref[page, offset, lo] = v_ref[rows, lo].astype(v_pages_ref.dtype)
    v_pages_ref[page, offset, hi] = v_ref[rows, hi].astype(v_pages_ref.dtype)


def rope_write_kv_call(q, k, v, cos_sin, k_pages, v_pages, slot_mapping,
                       q_norm, k_norm, *, eps, block_tokens, num_warps,
                       interpret):
    """The pallas_call; ``block_tokens`` already at most T."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_pages, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    norm = q_norm is not None
    if not norm:
        q_norm = k_norm = jnp.ones((head_dim,), q.dtype)
    kernel = functools.partial(rope_write_kv_kernel, block_tokens=block_tokens,
                               norm=norm, eps=eps)
    full = lambda x: pl.BlockSpec(x.shape, lambda i, h: (0,) * x.ndim)
    group_spec = pl.BlockSpec((num_tokens, group, head_dim),
                              lambda i, h: (0, h, 0))
    head_spec = pl.BlockSpec((num_tokens, None, head_dim),
                             lambda i, h: (0, h, 0))
    pages_spec = pl.BlockSpec((None, num_pages, page_size, head_dim),
                              lambda i, h: (h, 0, 0, 0))
    compiler_params = None
    if not interpret:
        # Imported here: a CPU process never builds Triton kernels.
        from jax.experimental.pallas import triton as plgpu
        compiler_params = plgpu.CompilerParams(num_warps=num_warps,
                                               num_stages=1)
    return pl.pallas_call(
        kernel,
        grid=(cdiv(num_tokens, block_tokens), num_kv_heads),
        in_specs=[full(slot_mapping), full(cos_sin), full(q_norm),
                  full(k_norm), group_spec, head_spec, head_spec,
                  pages_spec, pages_spec],
        out_specs=[group_spec, pages_spec, pages_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct(k_pages.shape, k_pages.dtype),
                   jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype)],
        input_output_aliases={7: 1, 8: 2},
        compiler_params=compiler_params,
        interpret=interpret,
        name="rope_write_kv",
    )(slot_mapping, cos_sin, q_norm, k_norm, q, k, v, k_pages, v_pages)


@functools.partial(jax.jit, static_argnames=("eps", "tuning", "interpret"))
def rope_write_kv(
    q: jax.Array,  # [T, N, H] projected queries
    k: jax.Array,  # [T, K, H] projected keys
    v: jax.Array,  # [T, K, H] values
    cos_sin: jax.Array,  # [T, H] f32 RoPE rows of each token's position
    k_pages: jax.Array,  # [K, num_pages, B, H]
    v_pages: jax.Array,  # [K, num_pages, B, H]
    slot_mapping: jax.Array,  # [T] int32 slot of each token; padding -> page 0
    q_norm: jax.Array | None = None,  # [H] RMSNorm weight of q; None: no norm
    k_norm: jax.Array | None = None,  # [H] RMSNorm weight of k
    *,
    eps: float = 1e-6,
    tuning: RopeWriteTuning = RopeWriteTuning(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """-> (rotated q [T, N, H], k_pages, v_pages with this step's rotated k
    and v at their slots). Same result as `rope_write_kv_reference`; the
    pages are updated in place when the caller donates them."""
    why = unsupported(q, k, v, cos_sin, k_pages, v_pages, q_norm, k_norm)
    if why is not None:
        raise ValueError(f"rope_write_kv does not take this case: {why}")
    # The largest power of two <= T: the shifted last tile stays inside T.
    block_tokens = min(tuning.block_tokens, 1 << (q.shape[0].bit_length() - 1))
    return rope_write_kv_call(
        q, k, v, cos_sin.astype(jnp.float32), k_pages, v_pages,
        slot_mapping.astype(jnp.int32), q_norm, k_norm, eps=eps,
        block_tokens=block_tokens, num_warps=tuning.num_warps,
        interpret=interpret)


def rope_write_kv_reference(q, k, v, cos_sin, k_pages, v_pages, slot_mapping,
                            q_norm=None, k_norm=None, *, eps=1e-6):
    """Plain jnp: the norms, RoPE, then ``kv_cache.write_kv``."""
    def rms_norm(x, w):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
        return w * xf.astype(x.dtype)

    def rope(x):
        half = x.shape[-1] // 2
        cos = jnp.tile(cos_sin[:, None, :half], 2)
        sin = jnp.tile(cos_sin[:, None, half:], 2)
        xf = x.astype(jnp.float32)
        rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
        return (xf * cos + rotated * sin).astype(x.dtype)

    if q_norm is not None:
        q, k = rms_norm(q, q_norm), rms_norm(k, k_norm)
    q, k = rope(q), rope(k)
    return (q, *write_kv(k_pages, v_pages, k, v, slot_mapping))
