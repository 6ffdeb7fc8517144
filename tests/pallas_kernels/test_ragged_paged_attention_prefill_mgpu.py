"""The Mosaic GPU prefill kernel.

On CPU: the work-item split and the boundary-chunk bookkeeping in plain jnp,
the kernel's lowering to a Mosaic GPU module for Hopper (``lower`` with
``lowering_platforms=("cuda",)`` builds the whole kernel, layout inference
included, without a GPU), the cases it refuses, and one small ragged case
run in Mosaic GPU's interpret mode against the reference (about a minute on
two cores: three warpgroups, simulated TMA and barriers). On a Hopper GPU
the ``gpu`` cases compare the compiled kernel with the jnp reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.pallas_kernels import ragged_paged_attention_prefill_mgpu as pm
from jaxinfer.pallas_kernels import ragged_paged_attention_reference
from tests.pallas_kernels.cases import TOLERANCE, interpreter_on_cpu, make_case, rel_error

ON_GPU = jax.default_backend() == "gpu"
gpu = pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA Hopper GPU")
MIX = [(2048, 2048), (512, 2048), (1, 129), (120, 597), (5, 18), (200, 200)]


def test_work_items_cover_each_prefill_row_once():
    mix = [(5, 18), (1, 9), (300, 1000), (130, 130), (2, 2), (1, 1)]
    cu = np.concatenate([[0], np.cumsum([q for q, _ in mix])]).astype(np.int32)
    tile, rows = 128, 736  # 439 real rows, then padding
    num_items = -(-rows // tile) + len(mix) + 2
    seq, start = pm.prefill_work_items(jnp.asarray(cu), jnp.int32(len(mix)),
                                       rows, num_items, tile)
    seq, start = np.asarray(seq), np.asarray(start)
    covered = np.zeros(rows, np.int32)
    zeroed = np.zeros(rows, np.int32)
    for s, st in zip(seq, start):
        if st < 0:
            continue
        assert st % 8 == 0
        if s < 0:  # a zero item: padding rows from the real end rounded up
            assert st >= -(-cu[-1] // 8) * 8
            zeroed[st:st + tile] += 1
            continue
        lo, hi = max(st, cu[s]), min(st + tile, cu[s + 1])
        assert lo < hi  # every item holds rows of its sequence
        covered[lo:hi] += 1
    for s, (q_len, _) in enumerate(mix):
        want = 1 if q_len > 1 else 0
        assert np.all(covered[cu[s]:cu[s + 1]] == want), s
    assert np.all(zeroed[-(-cu[-1] // 8) * 8:] == 1)
    assert not np.any(zeroed[:cu[-1]])


def _lower(case, tuning, **kw):
    fn = jax.jit(functools.partial(pm.prefill_attention, sm_scale=0.1,
                                   tuning=tuning, **kw))
    return fn.trace(*case).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("tuning,kw", [
    (pm.MosaicPrefillTuning(), {}),
    (pm.MosaicPrefillTuning(tokens_per_step=64, num_stages=4),
     dict(sliding_window=100, logit_soft_cap=30.0, k_scale=0.5, v_scale=2.0)),
])
def test_lowers_to_a_mosaic_gpu_kernel(tuning, kw):
    case = make_case([(5, 18), (130, 200), (1, 7)], num_q_heads=8,
                     num_kv_heads=2, head_dim=128, page_size=16,
                     dtype=jnp.bfloat16)
    text = _lower(case, tuning, **kw)
    assert "mosaic_gpu" in text


def test_refuses_what_it_cannot_take():
    ok = pm.supports(jnp.bfloat16, jnp.bfloat16, 128, 16)
    assert ok is None
    assert "dtype" in pm.supports(jnp.float32, jnp.float32, 128, 16)
    assert "page dtype" in pm.supports(jnp.bfloat16, jnp.float16, 128, 16)
    assert "page size" in pm.supports(jnp.bfloat16, jnp.bfloat16, 128, 24)
    assert "shared memory" in pm.supports(jnp.bfloat16, jnp.bfloat16, 256, 16)
    with pytest.raises(ValueError, match="block_q"):
        pm.MosaicPrefillTuning(block_q=128)
    with pytest.raises(ValueError, match="tokens_per_step"):
        pm.MosaicPrefillTuning(tokens_per_step=96)
    with pytest.raises(ValueError, match="num_stages"):
        pm.MosaicPrefillTuning(num_stages=1)
    case = make_case([(5, 18)], num_q_heads=2, num_kv_heads=1, head_dim=64,
                     dtype=jnp.float32)
    with pytest.raises(pm.MosaicPrefillUnsupported, match="dtype"):
        pm.prefill_attention(*case, sm_scale=0.1)


@gpu
@pytest.mark.parametrize("group,head_dim,page,kw", [
    (4, 128, 16, {}),
    (1, 128, 32, {}),
    (8, 64, 16, {}),
    (4, 128, 16, dict(sliding_window=300, logit_soft_cap=30.0)),
    (4, 64, 32, dict(k_scale=0.5, v_scale=1.5)),
    (4, 128, 32, dict(sliding_window=100)),
])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_prefill_matches_reference_on_gpu(group, head_dim, page, kw, dtype):
    case = make_case(MIX, num_q_heads=2 * group, num_kv_heads=2,
                     head_dim=head_dim, page_size=page, dtype=dtype,
                     seed=group + head_dim)
    dec = jax.random.normal(jax.random.PRNGKey(0),
                            (case[4].shape[0], *case[0].shape[1:]), dtype)
    out = jax.jit(functools.partial(pm.prefill_attention,
                                    sm_scale=head_dim ** -0.5, **kw))(*case, dec)
    _check_prefill(case, MIX, dec, out, **kw)


def _check_prefill(case, mix, dec, out, **kw):
    """Prefill rows match the reference; decode rows are ``dec``'s; padding
    rows are zero."""
    scale = case[0].shape[-1] ** -0.5
    ref = ragged_paged_attention_reference(*case, sm_scale=scale, **kw)
    cu = np.asarray(case[5])
    rows = np.concatenate([np.arange(cu[s], cu[s + 1])
                           for s, (q, _) in enumerate(mix) if q > 1])
    assert rel_error(out[rows], ref[rows]) < TOLERANCE.get(
        jnp.dtype(case[0].dtype), 2e-2)
    dec_seqs = [s for s, (q, _) in enumerate(mix) if q == 1]
    assert bool(jnp.all(out[cu[dec_seqs]] == dec[np.asarray(dec_seqs)]))
    assert not bool(jnp.any(out[cu[len(mix)]:]))


@interpreter_on_cpu
@pytest.mark.slow
def test_prefill_matches_reference_in_interpret_mode():
    """The kernel itself on CPU: a chunk reading a cached prefix across
    pages, a short fresh prefill and a decode, with window, soft-cap and
    scales; 64-token steps in a 2-stage ring, so slots are refilled."""
    mix = [(20, 150), (1, 9), (9, 9)]
    case = make_case(mix, num_q_heads=2, num_kv_heads=1, head_dim=64,
                     page_size=16, dtype=jnp.bfloat16, seed=11)
    dec = jax.random.normal(jax.random.PRNGKey(1),
                            (case[4].shape[0], *case[0].shape[1:]),
                            jnp.bfloat16)
    kw = dict(sliding_window=100, logit_soft_cap=20.0)
    out = pm.prefill_attention(
        *case, dec, sm_scale=64 ** -0.5, k_scale=0.5, v_scale=2.0,
        tuning=pm.MosaicPrefillTuning(tokens_per_step=64, num_stages=2),
        interpret=True, **kw)
    _check_prefill(case, mix, dec, out, k_scale=0.5, v_scale=2.0, **kw)


def test_public_api_lowers_with_the_mosaic_prefill():
    """ragged_paged_attention with prefill_backend='mosaic' builds the
    Mosaic prefill kernel for Hopper (both kernels Mosaic: lowerable without
    a GPU); interpret mode keeps the Triton prefill."""
    from jaxinfer.pallas_kernels import RaggedPagedAttentionTuning, ragged_paged_attention
    case = make_case([(5, 18), (1, 40), (130, 200)], num_q_heads=8,
                     num_kv_heads=2, head_dim=128, page_size=16,
                     dtype=jnp.bfloat16)
    tuning = RaggedPagedAttentionTuning(decode_backend="mosaic",
                                        prefill_backend="mosaic")
    fn = jax.jit(functools.partial(ragged_paged_attention, sm_scale=0.1,
                                   tuning=tuning))
    text = fn.trace(*case).lower(lowering_platforms=("cuda",)).as_text()
    assert "ragged_paged_attention_prefill_mgpu" in text
    assert "ragged_paged_attention_prefill\"" not in text  # no Triton call
    with pytest.raises(ValueError, match="prefill_backend"):
        RaggedPagedAttentionTuning(prefill_backend="cuda")
