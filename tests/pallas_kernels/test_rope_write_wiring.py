"""Which steps run rope_write_kv: the Llama family's on the Pallas backends;
the XLA path on "reference", on the "*_xla_rope" backends, and over fp8
pages with per-page scales. (Their tokens agree: test_e2e_pallas_backend.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxinfer.models import AttentionMetadata, ModelConfig, model_class, run_model
from jaxinfer.models.abstract import abstract_variables
from jaxinfer.models.runtime import model_constants
from jaxinfer.pallas_kernels import init_kv_pages
from jaxinfer.pallas_kernels.kv_cache import init_page_scales

CFG = ModelConfig(architecture="Qwen3ForCausalLM", vocab_size=96,
                  hidden_size=32, intermediate_size=48, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=16,
                  max_position_embeddings=64, qk_norm=True)
T = 5  # one sequence's prefill of 5 tokens on page 1, three padding rows


def _step_args(model, fp8: bool = False, rows: int = 8):
    params = nn.unbox(abstract_variables(model, CFG)["params"])  # shapes only
    dtype = jnp.float8_e4m3fn if fp8 else jnp.float32
    kv = init_kv_pages(1, 4, 16, CFG.num_kv_heads, CFG.head_dim, dtype)
    if fp8:
        kv = [pair + scales for pair, scales in zip(kv, init_page_scales(1, 4, 2))]
    md = AttentionMetadata(
        slot_mapping=np.array([16, 17, 18, 19, 20] + [0] * (rows - T), np.int32),
        block_tables=np.array([[1], [0]], np.int32),
        kv_lens=np.array([T, 0], np.int32),
        cu_q_lens=np.array([0, T, T], np.int32),
        num_seqs=np.array([1], np.int32))
    ids = jnp.arange(rows, dtype=jnp.int32) % CFG.vocab_size
    return (params, model_constants(model, 64), kv, ids,
            jnp.arange(rows, dtype=jnp.int32) % T, md, np.array([T - 1], np.int32))


def _runs_kernel(backend: str, fp8: bool = False, rows: int = 8) -> bool:
    model = model_class(CFG.architecture)(CFG, backend=backend,
                                          dtype=jnp.float32)
    args = _step_args(model, fp8, rows)
    jaxpr = jax.make_jaxpr(lambda *a: run_model(model, *a))(*args)
    return "name=rope_write_kv" in str(jaxpr)


@pytest.mark.parametrize("backend,fp8,runs", [
    ("pallas_interpret", False, True), ("pallas", False, True),
    ("pallas_triton", False, True), ("pallas_interpret", True, False),
    ("pallas_interpret_xla_rope", False, False), ("reference", False, False)])
def test_the_kernel_runs_where_it_should(backend, fp8, runs):
    assert _runs_kernel(backend, fp8) == runs


@pytest.mark.parametrize("backend,runs", [
    ("pallas", False), ("pallas_triton", False), ("pallas_interpret", True)])
def test_wide_gpu_steps_keep_the_xla_path(backend, runs):
    """Past ROPE_WRITE_MAX_TOKENS rows the GPU backends leave the work to
    XLA's fusions (faster there); the interpreter runs the kernel at any
    size, so CPU tests cover it."""
    from jaxinfer.models.attention import ROPE_WRITE_MAX_TOKENS
    assert _runs_kernel(backend, rows=ROPE_WRITE_MAX_TOKENS) is True
    assert _runs_kernel(backend, rows=ROPE_WRITE_MAX_TOKENS + 8) == runs
