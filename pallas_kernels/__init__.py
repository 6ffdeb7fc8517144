"""Pallas kernels and their pure-jnp references (``jaxinfer.pallas_kernels``).

Imports nothing else of jaxinfer.
"""

from .kv_cache import NULL_PAGE, gather_kv, init_kv_pages, kv_pages_shape, write_kv
from .ragged_paged_attention import (RaggedAttentionShapeError,
                                     ragged_paged_attention)
from .ragged_paged_attention_reference import ragged_paged_attention_reference
from .ragged_paged_attention_tuning import (RaggedPagedAttentionTuning,
                                            TuningError)

__all__ = ["NULL_PAGE", "gather_kv", "init_kv_pages", "kv_pages_shape",
           "write_kv", "ragged_paged_attention", "ragged_paged_attention_reference",
           "RaggedAttentionShapeError", "RaggedPagedAttentionTuning",
           "TuningError"]
