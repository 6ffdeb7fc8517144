"""write_kv puts exactly this step's K/V at the slots the block tables name,
and touches nothing else; gather_kv reads them back in token order."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.pallas_kernels import NULL_PAGE, gather_kv, init_kv_pages, kv_pages_shape, write_kv


@pytest.mark.parametrize("page_size,dtype", [(16, jnp.float32),
                                             (32, jnp.bfloat16)])
def test_write_kv_slots_exact(page_size, dtype):
    rng = np.random.default_rng(0)
    num_kv_heads, head_dim, num_pages = 2, 8, 12
    shape = kv_pages_shape(num_pages, page_size, num_kv_heads, head_dim)
    k_pages = jnp.asarray(rng.standard_normal(shape), dtype)
    v_pages = jnp.asarray(rng.standard_normal(shape), dtype)
    # Two sequences with scattered pages: seq 0 holds 20 tokens and appends 3;
    # seq 1 is a fresh prefill of 5. Two padding tokens go to the null page.
    tables = np.array([[7, 2, 9], [4, 0, 0]], np.int32)
    positions = [(0, 20), (0, 21), (0, 22)] + [(1, i) for i in range(5)]
    slots = [tables[s, p // page_size] * page_size + p % page_size
             for s, p in positions]
    slot_mapping = np.array(slots + [NULL_PAGE * page_size] * 2, np.int32)
    num_tokens = slot_mapping.shape[0]
    k = jnp.asarray(rng.standard_normal((num_tokens, num_kv_heads, head_dim)),
                    dtype)
    v = jnp.asarray(rng.standard_normal((num_tokens, num_kv_heads, head_dim)),
                    dtype)

    new_k, new_v = write_kv(k_pages, v_pages, k, v, jnp.asarray(slot_mapping))

    exp_k, exp_v = np.array(k_pages), np.array(v_pages)
    for t, slot in enumerate(slot_mapping[:len(slots)]):
        page, off = divmod(int(slot), page_size)
        exp_k[:, page, off] = np.asarray(k[t])
        exp_v[:, page, off] = np.asarray(v[t])
    real = np.ones(num_pages, bool)
    real[NULL_PAGE] = False  # padding writes land here; never read
    np.testing.assert_array_equal(np.asarray(new_k)[:, real], exp_k[:, real])
    np.testing.assert_array_equal(np.asarray(new_v)[:, real], exp_v[:, real])

    # Read back through the block tables in token order.
    g = gather_kv(new_k, jnp.asarray(tables))  # [S, P * B, K, H]
    for t, (s, p) in enumerate(positions):
        np.testing.assert_array_equal(np.asarray(g[s, p]), np.asarray(k[t]))


def test_init_kv_pages_shapes():
    pool = init_kv_pages(3, 5, 16, 2, 64, jnp.bfloat16)
    assert len(pool) == 3
    assert pool[0][0].shape == (2, 5, 16, 64) and pool[0][1].dtype == jnp.bfloat16
    assert not jnp.any(pool[2][1])


def test_one_token_write_is_exact_and_in_place():
    """A lone decode row (CPU buckets run one) writes its slot and nothing
    else, and the compiled step of write-then-read keeps the donated pool in
    place: XLA turns a one-index scatter into a dynamic-update-slice, and
    copy insertion then copied the whole pool around it several times a
    layer (0.75 s a step for the embedded model)."""
    import functools

    import jax
    rng = np.random.default_rng(1)
    shape = kv_pages_shape(64, 16, 3, 8)
    k_pages = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    v_pages = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 3, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, 3, 8)), jnp.float32)
    slot = jnp.asarray([5 * 16 + 3], jnp.int32)
    exp_k, exp_v = np.array(k_pages), np.array(v_pages)
    exp_k[:, 5, 3], exp_v[:, 5, 3] = np.asarray(k[0]), np.asarray(v[0])
    new_k, new_v = write_kv(k_pages, v_pages, k, v, slot)
    # The second row lands on the null page, which nothing reads.
    for got, exp in ((new_k, exp_k), (new_v, exp_v)):
        got = np.array(got)
        got[:, NULL_PAGE], exp[:, NULL_PAGE] = 0, 0
        np.testing.assert_array_equal(got, exp)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(kp, vp, k, v, slot, table):
        kp, vp = write_kv(kp, vp, k, v, slot)
        return kp, vp, gather_kv(kp, table).sum() + gather_kv(vp, table).sum()

    table = jnp.asarray([[5, 6]], jnp.int32)
    hlo = step.lower(k_pages, v_pages, k, v, slot, table).compile().as_text()
    pool = "f32[" + ",".join(map(str, shape)) + "]"
    copies = [line for line in hlo.splitlines()
              if " copy(" in line and pool in line.split("=")[1].split("copy(")[0]]
    assert not copies, copies[:3]


@pytest.mark.parametrize("platform,rows", [("cpu", 2), ("cuda", 1)])
def test_one_token_write_is_padded_for_the_cpu_only(platform, rows):
    """The null-page row that keeps XLA CPU's lone write in place is kept
    out of GPU programs, where the two-row scatter made the llama3-8b step
    at one sequence twice as slow (12.8 against 6.2 ms on an H200)."""
    import re

    import jax
    shape = kv_pages_shape(8, 4, 2, 16)
    pages = jnp.zeros(shape, jnp.float32)
    k = jnp.ones((1, 2, 16), jnp.float32)
    slot = jnp.asarray([5], jnp.int32)
    text = (jax.jit(write_kv, donate_argnums=(0, 1))
            .trace(pages, pages, k, k, slot)
            .lower(lowering_platforms=(platform,)).as_text())
    # A scatter's type closes its update region: (operand, indices, updates).
    index_shapes = set(re.findall(
        r'\}\) : \(tensor<[^>]*>, tensor<(\d+)x1xi32>, tensor<[^>]*>\)', text))
    assert index_shapes == {str(rows)}, index_shapes
