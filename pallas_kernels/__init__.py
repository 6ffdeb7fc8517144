"""Pallas kernels and their pure-jnp references (``jaxinfer.pallas_kernels``).

Imports nothing else of jaxinfer.
"""

# One module identity per file: this folder is the package ``jaxinfer.pallas_kernels``
# (reached through the ``jaxinfer/pallas_kernels`` link). Imported as a top-level
# ``pallas_kernels`` (from the repo root, say) every class would exist twice and
# ``except`` clauses would miss half the errors, so that name is refused.
if __name__ != "jaxinfer.pallas_kernels":
    raise ImportError(f"import jaxinfer.pallas_kernels, not {__name__}: the folder "
                      "pallas_kernels/ is installed as jaxinfer.pallas_kernels")

from .kv_cache import NULL_PAGE, gather_kv, init_kv_pages, kv_pages_shape, write_kv
from .ragged_paged_attention import RaggedAttentionShapeError, ragged_paged_attention
from .ragged_paged_attention_reference import ragged_paged_attention_reference
from .ragged_paged_attention_tuning import RaggedPagedAttentionTuning, TuningError

__all__ = ["NULL_PAGE", "gather_kv", "init_kv_pages", "kv_pages_shape",
           "write_kv", "ragged_paged_attention", "ragged_paged_attention_reference",
           "RaggedAttentionShapeError", "RaggedPagedAttentionTuning",
           "TuningError"]
