"""The KV pages' dtype (vLLM's ``kv_cache_dtype``) and what one page costs.

``auto`` keeps pages in the model's dtype; ``bfloat16`` stores them in
bf16 whatever the model computes in; ``fp8`` / ``fp8_e4m3`` (vLLM's CUDA
meaning of ``fp8``) and ``fp8_e5m2`` store one byte per element with one
f32 scale per (kv head, page) beside the pages (``kv_cache.write_kv_scaled``
writes them; the attention kernels read them through the block table), so
a page pool of the same memory holds twice the pages of a bf16 one (four
times an f32 one), less the scales' bytes.
"""

from __future__ import annotations

import jax.numpy as jnp

KV_CACHE_DTYPES = {
    "bfloat16": jnp.bfloat16,
    "fp8": jnp.float8_e4m3fn,
    "fp8_e4m3": jnp.float8_e4m3fn,
    "fp8_e5m2": jnp.float8_e5m2,
}


def kv_page_dtype(cache_dtype: str, model_dtype):
    """The pages' dtype for vLLM's ``kv_cache_dtype`` value."""
    if cache_dtype == "auto":
        return jnp.dtype(model_dtype)
    return jnp.dtype(KV_CACHE_DTYPES[cache_dtype])


def has_page_scales(page_dtype) -> bool:
    """Whether pages of this dtype carry per-page scales (the fp8 ones)."""
    return jnp.dtype(page_dtype).itemsize == 1


def page_bytes(num_layers: int, block_size: int, num_kv_heads: int,
               head_dim: int, page_dtype, kv_shards: int = 1) -> int:
    """Bytes of one page across all layers, K and V (and their per-page
    scales), on one device."""
    data = block_size * head_dim * jnp.dtype(page_dtype).itemsize
    scales = 4 if has_page_scales(page_dtype) else 0
    return 2 * num_layers * num_kv_heads * (data + scales) // kv_shards


# The Triton kernels address a layer's K or V page array ([K, pages, B, H]
# on one device) with 32-bit element offsets, so an array of 2**31 elements
# or more faults (CUDA illegal address). fp8 pages reach it first: a page
# costs half the bytes of a bf16 one, so the same memory holds twice as many.
MAX_PAGE_ARRAY_ELEMENTS = 2**31 - 1


def max_pages(block_size: int, num_kv_heads: int, head_dim: int) -> int:
    """The most pages a layer's page array on one device may hold
    (``num_kv_heads``: the kv heads on that device)."""
    return MAX_PAGE_ARRAY_ELEMENTS // (num_kv_heads * block_size * head_dim)
