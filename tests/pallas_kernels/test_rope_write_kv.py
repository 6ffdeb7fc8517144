"""rope_write_kv against the layer's XLA path (q/k RMSNorm, ``rope.apply_rope``,
then ``kv_cache.write_kv``): the rotated q, and the pages after the write."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from jaxinfer.models.layers import rms_norm
from jaxinfer.models.rope import apply_rope
from jaxinfer.pallas_kernels.kv_cache import NULL_PAGE, kv_pages_shape, write_kv
from jaxinfer.pallas_kernels.rope_write_kv import (
    RopeWriteTuning,
    rope_write_kv,
    rope_write_kv_reference,
    unsupported,
)
from tests.pallas_kernels.cases import INTERPRET

EPS = 1e-6
# The kernel and XLA may round a float32 multiply-add differently (a fused
# one, or another order): a rounding step of the activation dtype apart.
# A row or slot mixed up is off by the values themselves.
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2e-2}
# The interpreted kernel is an XLA CPU program of its own per shape; built
# without LLVM's heavier passes it compiles in about half the time.
QUICK_BUILD = ({} if not INTERPRET else
               {"xla_backend_optimization_level": 0,
                "xla_llvm_disable_expensive_passes": True})
kernel = jax.jit(rope_write_kv, static_argnames=("eps", "tuning", "interpret"),
                 compiler_options=QUICK_BUILD)


def make_case(*, num_tokens, num_kv_heads, group, head_dim, page_size,
              pad_tokens, dtype, norm, seed):
    """Random q/k/v, cos/sin rows and pages; the real tokens' slots are
    distinct and spread over pages 1.., the last ``pad_tokens`` rows aim
    at the null page."""
    rng = np.random.default_rng(seed)
    real = num_tokens - pad_tokens
    num_pages = real // page_size + 3
    shape = kv_pages_shape(num_pages, page_size, num_kv_heads, head_dim)
    slots = rng.permutation(np.arange(page_size, num_pages * page_size))[:real]
    slots = np.concatenate([slots, np.full(pad_tokens, NULL_PAGE * page_size)])
    normal = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
    angles = rng.uniform(0, 100, (num_tokens, head_dim // 2))
    cos_sin = np.concatenate([np.cos(angles), np.sin(angles)], -1) * 1.1
    norms = ((normal(head_dim), normal(head_dim)) if norm else (None, None))
    return (normal(num_tokens, num_kv_heads * group, head_dim),
            normal(num_tokens, num_kv_heads, head_dim),
            normal(num_tokens, num_kv_heads, head_dim),
            jnp.asarray(cos_sin, jnp.float32), normal(*shape), normal(*shape),
            jnp.asarray(slots, jnp.int32), *norms)


@functools.partial(jax.jit, compiler_options=QUICK_BUILD)
def xla_path(q, k, v, cos_sin, k_pages, v_pages, slots, q_norm, k_norm):
    """The XLA path between the projection and attention: the model's own
    norm and RoPE functions, then the write."""
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, EPS), rms_norm(k, k_norm, EPS)
    q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
    return (q, *write_kv(k_pages, v_pages, k, v, slots))


def check(case, tuning=None, own_reference=False):
    got = kernel(*case, eps=EPS, tuning=tuning or RopeWriteTuning(),
                 interpret=INTERPRET)
    exp = xla_path(*case)
    tol = TOLERANCE[jnp.dtype(case[0].dtype)]
    real = np.arange(case[4].shape[1]) != NULL_PAGE  # padding writes land on 0
    for g, e, what in zip(got, exp, ("q", "k pages", "v pages")):
        assert g.shape == e.shape and g.dtype == e.dtype, what
        g, e = np.asarray(g, np.float32), np.asarray(e, np.float32)
        if what != "q":
            g, e = g[:, real], e[:, real]
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=what)
    # v is copied as it is.
    np.testing.assert_array_equal(got[2][:, real], exp[2][:, real])
    if own_reference:  # the file's own jnp reference is the same path
        ref = jax.jit(rope_write_kv_reference, static_argnames="eps")(*case,
                                                                      eps=EPS)
        # Padding rows all write the null page: which of them lands there
        # is the scatter's choice, so the null page is not compared.
        for r, e, what in zip(ref, exp, ("q", "k pages", "v pages")):
            r, e = np.asarray(r), np.asarray(e)
            if what != "q":
                r, e = r[:, real], e[:, real]
            np.testing.assert_array_equal(r, e, err_msg=what)


# No shrinking: each example is a compile of its own (seconds interpreted).
@settings(max_examples=4, deadline=None, derandomize=True,
          phases=(Phase.explicit, Phase.generate))
@given(num_tokens=st.integers(1, 40), num_kv_heads=st.sampled_from([1, 2, 3]),
       group=st.sampled_from([1, 3, 4]), head_dim=st.sampled_from([16, 64]),
       page_size=st.sampled_from([4, 16]), pad=st.integers(0, 5),
       dtype=st.sampled_from([jnp.bfloat16, jnp.float32]),
       norm=st.booleans(), block_tokens=st.sampled_from([8, 16]))
def test_equals_the_xla_path(num_tokens, num_kv_heads, group, head_dim,
                             page_size, pad, dtype, norm, block_tokens):
    """GQA groups (including ones that are no power of two), T off any
    tile multiple, padding rows on the null page, norms on and off."""
    case = make_case(num_tokens=num_tokens, num_kv_heads=num_kv_heads,
                     group=group, head_dim=head_dim, page_size=page_size,
                     pad_tokens=min(pad, num_tokens - 1), dtype=dtype,
                     norm=norm, seed=num_tokens)
    check(case, RopeWriteTuning(block_tokens=block_tokens))


@pytest.mark.parametrize("num_tokens,pad,norm", [(1, 0, False), (21, 4, True)])
def test_fixed_cases(num_tokens, pad, norm):
    """A lone decode row; and 21 rows (16 + a shifted tile of 16 that
    recomputes 11) with four padding rows, Qwen3's norms on, bf16."""
    check(make_case(num_tokens=num_tokens, num_kv_heads=2, group=4,
                    head_dim=32, page_size=16, pad_tokens=pad,
                    dtype=jnp.bfloat16, norm=norm, seed=7), own_reference=True)


def test_refuses_what_it_does_not_do():
    case = make_case(num_tokens=4, num_kv_heads=2, group=2, head_dim=16,
                     page_size=4, pad_tokens=0, dtype=jnp.float32, norm=False,
                     seed=0)
    q, k, v, cos_sin, kp, vp = case[:6]
    assert unsupported(q, k, v, cos_sin, kp, vp) is None
    assert "partial rotary" in unsupported(q, k, v, cos_sin[:, :8], kp, vp)
    assert "power of two" in unsupported(q[..., :12], k[..., :12], v[..., :12],
                                         cos_sin[:, :12], kp[..., :12],
                                         vp[..., :12])
    fp8 = kp.astype(jnp.float8_e4m3fn)
    assert "dtype" in unsupported(q, k, v, cos_sin, fp8, fp8)
    assert "norm weight" in unsupported(q, k, v, cos_sin, kp, vp,
                                        jnp.ones(16, jnp.bfloat16),
                                        jnp.ones(16, jnp.bfloat16))
    with pytest.raises(ValueError, match="partial rotary"):
        rope_write_kv(q, k, v, cos_sin[:, :8], kp, vp, case[6],
                      interpret=True)
    with pytest.raises(ValueError, match="block_tokens"):
        RopeWriteTuning(block_tokens=12)


def test_lowers_for_cuda_in_place():
    """The Triton lowering builds (tensor sizes, indexing) and the pages
    are outputs aliased to their inputs: no copy of the pool per layer."""
    import re
    S = jax.ShapeDtypeStruct
    T, N, K, H, B, P = 5, 12, 4, 128, 16, 64
    args = [S((T, N, H), jnp.bfloat16), S((T, K, H), jnp.bfloat16),
            S((T, K, H), jnp.bfloat16), S((T, H), jnp.float32),
            S((K, P, B, H), jnp.bfloat16), S((K, P, B, H), jnp.bfloat16),
            S((T,), jnp.int32), S((H,), jnp.bfloat16), S((H,), jnp.bfloat16)]
    text = (jax.jit(rope_write_kv, donate_argnums=(4, 5)).trace(*args)
            .lower(lowering_platforms=("cuda",)).as_text())
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert sorted(re.findall(r"tf\.aliasing_output = (\d+)", text)) == ["1", "2"]
