"""Pallas kernels and their pure-jnp references (``jaxinfer.pallas_kernels``).

Imports nothing else of jaxinfer.
"""

from .kv_cache import NULL_PAGE, gather_kv, init_kv_pages, kv_pages_shape, write_kv
from .ragged_paged_attention_reference import ragged_paged_attention_reference

__all__ = ["NULL_PAGE", "gather_kv", "init_kv_pages", "kv_pages_shape",
           "write_kv", "ragged_paged_attention_reference"]
