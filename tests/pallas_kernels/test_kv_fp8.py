"""fp8 KV pages with one scale per (kv head, page): the writer against a
NumPy model of the same rules, page by page, over steps that fill pages
across prefill chunks and decodes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxinfer.pallas_kernels.kv_cache import pages_touched_bound, write_kv_scaled

B, K, H, PAGES = 4, 2, 8, 12


def _numpy_write(pages, scales, new, slots, dtype):
    """The rules of write_kv_scaled, page by page: a step that writes a
    page's offset 0 starts it afresh; otherwise the page's scale becomes
    max(old, amax(new) / max) and its earlier codes are requantized by
    old / new."""
    qmax = float(ml_dtypes.finfo(dtype).max)
    inv = np.float32(1.0 / qmax)
    pages, scales = pages.copy(), scales.copy()
    page_of, off = slots // B, slots % B
    for p in dict.fromkeys(page_of.tolist()):  # in order of first token
        toks = np.flatnonzero(page_of == p)
        fresh = bool((off[toks] == 0).any())
        for h in range(K):
            old = np.float32(0.0) if fresh else scales[h, p]
            amax = np.abs(new[toks, h]).max().astype(np.float32)
            scale = max(old, np.float32(amax * inv))
            div = scale if scale > 0 else np.float32(1.0)
            held = pages[h, p].astype(np.float32) * np.float32(old / div)
            for t in toks:
                held[off[t]] = new[t, h] / div
            pages[h, p] = np.clip(held, -qmax, qmax).astype(dtype)
            scales[h, p] = scale
    return pages, scales


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_writes_equal_the_numpy_model_over_steps(dtype):
    rng = np.random.default_rng(0)
    np_dtype = np.dtype(dtype)
    pages = np.zeros((K, PAGES, B, H), np_dtype)
    scales = np.zeros((K, PAGES), np.float32)
    kp = vp = jnp.asarray(pages)
    ks = vs = jnp.asarray(scales)
    np_k, np_ks = pages, scales
    np_v, np_vs = pages, scales
    # (tokens per sequence this step, their first slot); sequence A owns
    # pages 1-3, B pages 5-6; the last rows of each step are padding
    # (slot 0, the null page).
    steps = [[(6, 1 * B), (3, 5 * B)],  # prefill: A fills page 1, starts 2
             [(1, 1 * B + 6 - B + B), (1, 5 * B + 3)],  # decodes
             [(3, 2 * B + 3), (2, 6 * B)],  # A crosses into page 3
             [(1, 3 * B + 2)]]
    for step in steps:
        slots = np.concatenate([np.arange(s, s + n) for n, s in step]
                               + [np.zeros(2, np.int64)]).astype(np.int32)
        T = len(slots)
        # Growing magnitudes: later tokens raise a page's scale.
        k = (rng.normal(size=(T, K, H)) * rng.uniform(0.1, 8, (T, 1, 1))
             ).astype(np.float32)
        v = rng.normal(size=(T, K, H)).astype(np.float32)
        bound = pages_touched_bound(T, len(step) + 1, B)
        kp, vp, ks, vs = jax.jit(write_kv_scaled, static_argnums=7)(
            kp, vp, ks, vs, jnp.asarray(k), jnp.asarray(v),
            jnp.asarray(slots), bound)
        np_k, np_ks = _numpy_write(np_k, np_ks, k, slots, np_dtype)
        np_v, np_vs = _numpy_write(np_v, np_vs, v, slots, np_dtype)
        real = slice(1, None)  # page 0 (padding) holds nothing read
        np.testing.assert_array_equal(np.asarray(ks)[:, real], np_ks[:, real])
        np.testing.assert_array_equal(np.asarray(vs)[:, real], np_vs[:, real])
        np.testing.assert_array_equal(
            np.asarray(kp).view(np.uint8)[:, real],
            np_k.view(np.uint8)[:, real])
        np.testing.assert_array_equal(
            np.asarray(vp).view(np.uint8)[:, real],
            np_v.view(np.uint8)[:, real])


def test_dequantized_pages_stay_close_to_what_was_written():
    """Each token read back (codes x page scale) is within fp8 e4m3
    rounding of its value, even after later tokens raised the scale."""
    rng = np.random.default_rng(1)
    kp = vp = jnp.zeros((K, PAGES, B, H), jnp.float8_e4m3fn)
    ks = vs = jnp.zeros((K, PAGES), jnp.float32)
    written = np.zeros((K, PAGES * B, H), np.float32)
    for pos in range(3 * B):  # one sequence decoding into pages 1..3
        slot = np.array([B + pos], np.int32)
        k = (rng.normal(size=(1, K, H)) * (1 + pos)).astype(np.float32)
        kp, vp, ks, vs = write_kv_scaled(kp, vp, ks, vs, jnp.asarray(k),
                                         jnp.asarray(k), jnp.asarray(slot), 1)
        written[:, B + pos] = k[0]
    deq = (np.asarray(kp).astype(np.float32) *
           np.asarray(ks)[:, :, None, None]).reshape(K, PAGES * B, H)
    span = slice(B, 4 * B)
    page_max = np.repeat(np.abs(written[:, span]).reshape(K, 3, B * H).max(-1),
                         B, axis=1)[..., None]
    # e4m3: 3 mantissa bits (relative 2**-4), requantized at most once per
    # growth (twice the rounding), subnormals below 2**-6 of the page max.
    err = np.abs(deq[:, span] - written[:, span])
    assert np.all(err <= 2 * 2.0**-4 * np.abs(written[:, span])
                  + 2.0**-9 * page_max)


def test_the_bound_covers_every_ragged_step():
    # a sequence of q tokens starting at offset B - 1 spans (q - 1) // B + 2
    for q in range(1, 40):
        spans = (B - 1 + q - 1) // B + 1
        assert spans <= (q - 1) // B + 2
        assert pages_touched_bound(q + 1, 2, B) >= spans + 1


def test_one_token_write_equals_the_model_and_stays_in_place():
    """A lone decode row (CPU buckets run one): the same rules as the NumPy
    model, and the compiled write keeps the donated pages in place (a
    one-page scatter would become a dynamic-update-slice that XLA copies
    the pool around; see test_kv_cache's one-token test)."""
    rng = np.random.default_rng(3)
    dtype = jnp.float8_e4m3fn
    np_dtype = np.dtype(dtype)
    pages = (rng.normal(size=(K, PAGES, B, H)) * 50).astype(np_dtype)
    scales = rng.uniform(0.01, 0.1, (K, PAGES)).astype(np.float32)
    slots = np.array([3 * B + 2], np.int32)  # mid-page: requantizes page 3
    k = (rng.normal(size=(1, K, H)) * 9).astype(np.float32)
    bound = pages_touched_bound(1, 1, B)
    write = jax.jit(write_kv_scaled, static_argnums=7, donate_argnums=(0, 2))
    lowered = write.lower(jnp.asarray(pages), jnp.asarray(pages),
                          jnp.asarray(scales), jnp.asarray(scales),
                          jnp.asarray(k), jnp.asarray(k), jnp.asarray(slots),
                          bound)
    hlo = lowered.compile().as_text()
    pool = f"f8e4m3fn[{K},{PAGES},{B},{H}]"
    copies = [line for line in hlo.splitlines()
              if " copy(" in line and pool in line.split("=")[1].split("copy(")[0]]
    assert not copies, copies[:3]
    kp, _, ks, _ = write(jnp.asarray(pages), jnp.asarray(pages),
                         jnp.asarray(scales), jnp.asarray(scales),
                         jnp.asarray(k), jnp.asarray(k), jnp.asarray(slots),
                         bound)
    np_k, np_ks = _numpy_write(pages, scales, k, slots, np_dtype)
    real = slice(1, None)
    np.testing.assert_array_equal(np.asarray(ks)[:, real], np_ks[:, real])
    np.testing.assert_array_equal(np.asarray(kp).view(np.uint8)[:, real],
                                  np_k.view(np.uint8)[:, real])
