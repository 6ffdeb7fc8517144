"""Abstract arguments for lowering the Mosaic decode kernel for cuda on a
machine without a GPU. Kept free of pytest, so the benchmarks' preflight
can run it in a bare venv of another jax version."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def decode_lowering_args(page_dtype, head_dim: int, group: int,
                         per_page: bool) -> list:
    """Abstract arguments of ``decode_attention`` (4 sequences, 2 kv heads,
    page 16, 300 pages each) for lowering the Mosaic decode kernel without
    running it: the CPU tests' cuda lowering and the benchmarks' preflight."""
    S, K, B, P = 4, 2, 16, 300
    num_pages = S * P + 1
    args = [jax.ShapeDtypeStruct((S, K, group, head_dim), jnp.bfloat16),
            jax.ShapeDtypeStruct((K, num_pages, B, head_dim), page_dtype),
            jax.ShapeDtypeStruct((K, num_pages, B, head_dim), page_dtype),
            jax.ShapeDtypeStruct((S,), jnp.int32),
            jax.ShapeDtypeStruct((S, P), jnp.int32)]
    if per_page:
        args.append(jax.ShapeDtypeStruct((K, 2, num_pages), jnp.float32))
    return args
