"""The attention backend names: what each one runs, and the GPU default."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jaxinfer.models import attention
from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import default_tuning


def test_gpu_default_is_a_known_backend_and_cpu_takes_the_reference():
    assert attention.GPU_DEFAULT_BACKEND in attention.BACKENDS
    assert attention.resolve_backend(None) == "reference"  # this CPU box
    with pytest.raises(ValueError, match="pallas_triton"):
        attention.resolve_backend("flash")


def test_pallas_triton_keeps_the_tuned_table_on_the_triton_lowering():
    seen = {}

    def fake_kernel(q, k_pages, *args, tuning, **kw):
        seen["tuning"] = tuning
        return q

    q = jnp.zeros((3, 8, 128))
    pages = jnp.zeros((2, 5, 16, 128))
    attention._triton_only(fake_kernel, q, pages, sm_scale=0.1)
    t, tuned = seen["tuning"], default_tuning(128, 16)
    assert (t.decode_backend, t.prefill_backend) == ("triton", "triton")
    assert t.decode_pages_per_block == tuned.decode_pages_per_block
    assert t.prefill_block_q == tuned.prefill_block_q


def test_cli_flag_reaches_the_engine_args():
    import argparse

    from jaxinfer.entrypoints.cli import add_engine_args, engine_args_from
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = engine_args_from(p.parse_args(["--attention-backend", "pallas"]))
    assert args.attention_backend == "pallas"
    with pytest.raises(SystemExit):
        p.parse_args(["--attention-backend", "flash"])
