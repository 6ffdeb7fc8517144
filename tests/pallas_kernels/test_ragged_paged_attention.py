"""The Pallas ragged paged attention kernels against the jnp reference.

On CPU the kernels run in interpret mode; on a GPU the same cases run compiled
(Triton), plus the ``gpu``-marked cases at model sizes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from jaxinfer.pallas_kernels import (
    RaggedAttentionShapeError,
    RaggedPagedAttentionTuning,
    TuningError,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)
from tests.pallas_kernels.cases import INTERPRET, check_against_reference, gpu, make_case, rel_error

# (q_len, kv_len): decodes at one and at many pages, a short and a long chunk
# of a prefill whose prefix is already cached, and a fresh prefill.
MIX = [(1, 1), (1, 129), (5, 18), (120, 597), (33, 33)]


_check = check_against_reference


@pytest.mark.parametrize("page_size,group,head_dim,dtype", [
    (16, 1, 64, jnp.float32),
    (32, 4, 128, jnp.float32),
    (16, 8, 64, jnp.bfloat16),
    (32, 4, 64, jnp.bfloat16),
])
def test_matches_reference(page_size, group, head_dim, dtype):
    case = make_case(MIX, num_q_heads=2 * group, num_kv_heads=2,
                     head_dim=head_dim, page_size=page_size, dtype=dtype)
    _check(case)


@pytest.mark.parametrize("window,cap", [(40, None), (None, 3.0), (7, 2.0)])
def test_sliding_window_and_soft_cap(window, cap):
    case = make_case(MIX, num_q_heads=8, num_kv_heads=2, page_size=16, seed=1)
    _check(case, sliding_window=window, logit_soft_cap=cap)


def test_split_kv_decode_combines_partials():
    """Few long decodes: the KV axis is split over programs and merged."""
    case = make_case([(1, 700), (1, 45), (1, 333)], num_q_heads=8,
                     num_kv_heads=2, page_size=16, seed=2)
    tuning = RaggedPagedAttentionTuning(decode_pages_per_block=2,
                                        decode_kv_splits=8)
    _check(case, tuning=tuning)
    _check(case, tuning=tuning, sliding_window=100)
    prefetch = RaggedPagedAttentionTuning(decode_pages_per_block=2,
                                          decode_kv_splits=4,
                                          decode_prefetch=True)
    _check(case, tuning=prefetch, logit_soft_cap=5.0)


def test_decode_only_on_the_triton_path():
    """decode_only runs the decode kernel alone; rows beyond the sequences
    (and padding sequences) stay zero."""
    case = make_case([(1, 700), (1, 45), (1, 3)], num_q_heads=8,
                     num_kv_heads=2, page_size=32, seed=8)
    tuning = RaggedPagedAttentionTuning(decode_pages_per_block=2,
                                        decode_kv_splits=4)
    _check(case, tuning=tuning, decode_only=True, sliding_window=64)

    def kernel_calls(**kw):
        jaxpr = jax.make_jaxpr(functools.partial(
            ragged_paged_attention, sm_scale=0.125, tuning=tuning,
            interpret=INTERPRET, **kw))(*case)
        return str(jaxpr).count("pallas_call")
    assert kernel_calls(decode_only=True) == 1  # the decode kernel alone
    assert kernel_calls() == 2  # decode and prefill


@pytest.mark.slow
def test_long_prefill_chunk():
    case = make_case([(512, 2048), (1, 1000), (64, 64)], num_q_heads=4,
                     num_kv_heads=1, page_size=32, seed=3)
    _check(case)


def test_fp8_pages_with_scales():
    case = list(make_case(MIX[:4], num_q_heads=4, num_kv_heads=2, seed=4,
                          dtype=jnp.bfloat16))
    case[1] = case[1].astype(jnp.float8_e4m3fn)
    case[2] = case[2].astype(jnp.float8_e4m3fn)
    _check(tuple(case), k_scale=jnp.float32(0.5), v_scale=jnp.float32(3.0))


def _page_scales(case, seed):
    """Random per-(kv head, page) scales for a case's pool."""
    num_kv_heads, num_pages = case[1].shape[:2]
    ks, vs = jax.random.uniform(jax.random.PRNGKey(seed), (2, num_kv_heads,
                                num_pages), minval=0.25, maxval=4.0)
    return ks, vs


def test_per_page_scales_in_the_reference_dequantize_each_page():
    """The reference with per-page scales equals the reference on pages
    multiplied out beforehand: the hook means what kv_cache.py says."""
    case = make_case(MIX, num_q_heads=4, num_kv_heads=2, seed=9)
    q, kp, vp, *md = case
    ks, vs = _page_scales(case, 1)
    out = ragged_paged_attention_reference(q, kp, vp, *md, sm_scale=0.125,
                                           k_scale=ks, v_scale=vs)
    deq = ragged_paged_attention_reference(
        q, kp * ks[:, :, None, None], vp * vs[:, :, None, None], *md,
        sm_scale=0.125)
    assert rel_error(out, deq) < 1e-5
    plain = ragged_paged_attention_reference(q, kp, vp, *md, sm_scale=0.125)
    assert rel_error(out, plain) > 0.1  # the scales did change the result


# A verifying step's sequences: k + 1 = 5 tokens each, fewer where a row
# drafted less, one a plain decode; contexts within a page and over many.
VERIFY_MIX = [(5, 5), (5, 700), (3, 45), (1, 129), (5, 37)]


@pytest.mark.parametrize("group,dtype,window,cap", [
    (4, jnp.float32, None, None),
    (1, jnp.bfloat16, None, None),
    (8, jnp.bfloat16, 40, 3.0),
])
def test_short_queries_through_the_decode_kernel(group, dtype, window, cap):
    """max_q_len: every sequence's few query tokens in the decode kernel's
    rows, each masked causally, match the reference (split KV included)."""
    case = make_case(VERIFY_MIX, num_q_heads=2 * group, num_kv_heads=2,
                     page_size=16, dtype=dtype, seed=11)
    tuning = RaggedPagedAttentionTuning(decode_pages_per_block=2,
                                        decode_kv_splits=4)
    _check(case, tuning=tuning, max_q_len=5, sliding_window=window,
           logit_soft_cap=cap)
    jaxpr = jax.make_jaxpr(functools.partial(
        ragged_paged_attention, sm_scale=0.125, tuning=tuning,
        interpret=INTERPRET, max_q_len=5))(*case)
    assert str(jaxpr).count("pallas_call") == 1  # no prefill kernel


def test_short_queries_with_per_page_fp8_scales():
    case = list(make_case(VERIFY_MIX, num_q_heads=8, num_kv_heads=2, seed=12,
                          dtype=jnp.bfloat16))
    case[1] = case[1].astype(jnp.float8_e4m3fn)
    case[2] = case[2].astype(jnp.float8_e4m3fn)
    ks, vs = _page_scales(case, 3)
    _check(tuple(case), k_scale=ks, v_scale=vs, max_q_len=5)


@pytest.mark.parametrize("page_size,decode_only", [(16, False), (32, False),
                                                   (16, True)])
def test_fp8_pages_with_per_page_scales(page_size, decode_only):
    mix = [(1, 70), (1, 3), (1, 200)] if decode_only else MIX[:4]
    case = list(make_case(mix, num_q_heads=8, num_kv_heads=2, seed=10,
                          page_size=page_size, dtype=jnp.bfloat16))
    case[1] = case[1].astype(jnp.float8_e4m3fn)
    case[2] = case[2].astype(jnp.float8_e4m3fn)
    ks, vs = _page_scales(case, 2)
    tuning = RaggedPagedAttentionTuning(decode_pages_per_block=2,
                                        decode_kv_splits=2)
    _check(tuple(case), tuning=tuning, k_scale=ks, v_scale=vs,
           decode_only=decode_only)
    # One scale per page for K, one per tensor for V.
    _check(tuple(case), tuning=tuning, k_scale=ks, v_scale=jnp.float32(2.0),
           decode_only=decode_only)


def test_rejects_bad_scales():
    case = make_case(MIX[:2], num_q_heads=4, num_kv_heads=2)
    with pytest.raises(RaggedAttentionShapeError, match="per .kv head, page."):
        ragged_paged_attention(*case, sm_scale=0.1, interpret=INTERPRET,
                               k_scale=jnp.ones((2, 3)))
    forced = RaggedPagedAttentionTuning(decode_backend="mosaic")
    ks, _ = _page_scales(case, 3)
    with pytest.raises(RaggedAttentionShapeError, match="per-page"):
        ragged_paged_attention(*case, sm_scale=0.1, interpret=INTERPRET,
                               tuning=forced, k_scale=ks)


def test_rejects_bad_shapes_and_tuning():
    case = make_case([(1, 5)], num_q_heads=6, num_kv_heads=4)
    with pytest.raises(RaggedAttentionShapeError, match="multiple of kv"):
        ragged_paged_attention(*case, sm_scale=1.0, interpret=True)
    with pytest.raises(TuningError, match="prefill_block_q"):
        RaggedPagedAttentionTuning(prefill_block_q=48)
    with pytest.raises(TuningError, match="decode_kv_splits"):
        RaggedPagedAttentionTuning(decode_kv_splits=3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,page_size,group", [
    (128, 16, 4), (256, 16, 8), (64, 32, 1), (128, 32, 8)])
def test_model_sizes_on_gpu(head_dim, page_size, group):
    mix = [(1, 1), (1, 129), (5, 18), (120, 597), (512, 2048), (1, 4000)]
    case = make_case(mix, num_q_heads=8 * group, num_kv_heads=8,
                     head_dim=head_dim, page_size=page_size,
                     dtype=jnp.bfloat16, seed=5)
    _check(case)
    _check(case, sliding_window=300, logit_soft_cap=30.0)
