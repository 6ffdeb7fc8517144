"""Random ragged batches for attention kernels (tests and the GPU benchmark).

A case is the argument tuple of ``ragged_paged_attention``: random q and pages
(never zeros), sequences' pages scattered at random over the pool (page 0 is
the null page and stays unused), one padding sequence row and a few padding
token rows, as the model runner's buckets produce.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU  # the kernels run interpreted on CPU, compiled on GPU
gpu = pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
# Tests that run a Mosaic GPU kernel in jax's interpreter whatever the
# backend: the CPU suite's path. On the H200 machine (jax 0.11.2) the
# interpreter did not finish within minutes (the prefill kernel's and the
# int4 kernel's cases), so there the compiled ``gpu`` cases stand in.
interpreter_on_cpu = pytest.mark.skipif(
    ON_GPU, reason="Mosaic GPU's interpreter runs in the CPU suite; on a "
    "GPU the compiled cases run instead")

# Relative L2 error allowed per dtype: f32 leaves room for tf32 tensor-core
# dots on GPU; bf16 for bf16 probabilities and output rounding.
TOLERANCE = {jnp.dtype(jnp.float32): 2e-3, jnp.dtype(jnp.bfloat16): 2e-2}


def make_case(mix, *, num_q_heads=4, num_kv_heads=2, head_dim=64,
              page_size=16, dtype=jnp.float32, seed=0, pad_tokens=3,
              pad_seqs=1, extra_pages=1):
    """mix: [(q_len, kv_len)] -> (q, k_pages, v_pages, kv_lens, block_tables,
    cu_q_lens, num_seqs)."""
    rng = np.random.default_rng(seed)
    num_seqs = len(mix)
    need = [-(-kv // page_size) for _, kv in mix]
    pages_per_seq = max(need) + extra_pages
    num_pages = sum(need) + 1
    perm = rng.permutation(np.arange(1, num_pages))
    tables = np.zeros((num_seqs + pad_seqs, pages_per_seq), np.int32)
    used = 0
    for s, n in enumerate(need):
        tables[s, :n] = perm[used:used + n]
        used += n
    q_lens = [ql for ql, _ in mix] + [0] * pad_seqs
    kv_lens = np.array([kv for _, kv in mix] + [0] * pad_seqs, np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    num_tokens = int(cu[-1]) + pad_tokens
    shape = (num_kv_heads, num_pages, page_size, head_dim)
    q = rng.standard_normal((num_tokens, num_q_heads, head_dim))
    k = rng.standard_normal(shape)
    v = rng.standard_normal(shape)
    return (jnp.asarray(q, dtype), jnp.asarray(k, dtype), jnp.asarray(v, dtype),
            jnp.asarray(kv_lens), jnp.asarray(tables), jnp.asarray(cu),
            jnp.asarray([num_seqs], jnp.int32))


def fp8_case(mix, seed, **kw):
    """A case whose pages are fp8 e4m3 codes with one scale per (kv head,
    page), as kv_cache.write_kv_scaled writes them: each page's values get
    their own magnitude (K 0.1x to 3x, V 0.05x to 20x: a scale applied to
    the wrong page or head, or not at all, shows; K's range keeps logits
    moderate, as a model's are), scale = amax / 448. Returns (case, K
    scales, V scales), the scales [K, num_pages] f32."""
    q, kp, vp, *md = make_case(mix, dtype=jnp.float32, seed=seed, **kw)
    rng = np.random.default_rng(seed + 100)
    qmax = float(jnp.finfo(jnp.float8_e4m3fn).max)
    out, scales = [], []
    for pages, (lo, hi) in ((kp, (0.1, 3.0)), (vp, (0.05, 20.0))):
        mag = np.exp(rng.uniform(np.log(lo), np.log(hi),
                                 pages.shape[:2]))[..., None, None]
        pages = np.asarray(pages) * mag
        scale = np.abs(pages).max(axis=(2, 3)) / qmax  # [K, num_pages]
        out.append(jnp.asarray(pages / scale[..., None, None],
                               jnp.float8_e4m3fn))
        scales.append(jnp.asarray(scale, jnp.float32))
    case = (q.astype(jnp.bfloat16), *out, *md)
    return case, scales[0], scales[1]


def rel_error(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def check_against_reference(case, tuning=None, **kw):
    """Runs ``ragged_paged_attention`` on ``case`` and asserts it matches the
    jnp reference within the dtype's tolerance, with padding rows exactly
    zero. Returns the kernel's output."""
    from jaxinfer.pallas_kernels import ragged_paged_attention, ragged_paged_attention_reference
    scale = case[0].shape[-1] ** -0.5
    hints = {k: kw.pop(k) for k in ("decode_only", "max_q_len") if k in kw}
    out = ragged_paged_attention(*case, sm_scale=scale, tuning=tuning,
                                 interpret=INTERPRET, **hints, **kw)
    ref = ragged_paged_attention_reference(*case, sm_scale=scale, **kw)
    assert out.shape == ref.shape and out.dtype == case[0].dtype
    err = rel_error(out, ref)
    assert err < TOLERANCE[jnp.dtype(case[0].dtype)], err
    # Padding rows past the last sequence are exactly zero.
    num_real = int(case[5][int(case[6][0])])
    assert not jnp.any(out[num_real:])
    return out
