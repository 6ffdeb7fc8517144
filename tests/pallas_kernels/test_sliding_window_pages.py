"""A sliding-window layer's attention reads only the pages its window
covers: pages wholly before every query's window are filled with NaN, and
the kernels' output still equals the reference's on clean pages (any read
of a NaN page would poison the softmax or the value sum). The reference,
which gathers every page, turns NaN on the same input: the test can fail."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.pallas_kernels import (
    RaggedPagedAttentionTuning,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)
from tests.pallas_kernels.cases import INTERPRET, make_case

PAGE = 16
# Tiles of one page, so that the window's first tile starts at its page.
TUNING = RaggedPagedAttentionTuning(decode_pages_per_block=1,
                                    prefill_pages_per_block=1)


def _poison_outside(case, mix, window):
    """The case with K/V pages wholly before each sequence's earliest
    window set to NaN; also the number of pages poisoned."""
    q, k, v, kv_lens, tables, cu, num_seqs = case
    k, v = np.array(k), np.array(v)
    tables_np = np.asarray(tables)
    poisoned = 0
    for s, (q_len, kv_len) in enumerate(mix):
        first_visible = kv_len - q_len - window + 1
        for j in range(max(first_visible, 0) // PAGE):
            page = tables_np[s, j]
            k[:, page] = np.nan
            v[:, page] = np.nan
            poisoned += 1
    return (q, jnp.asarray(k), jnp.asarray(v), kv_lens, tables, cu,
            num_seqs), poisoned


@pytest.mark.parametrize("decode_only,mix", [
    (False, [(1, 200), (7, 90), (40, 170), (1, 9)]),
    (True, [(1, 200), (1, 77), (1, 5)]),
])
def test_pages_outside_the_window_are_never_read(decode_only, mix):
    window = 24
    case = make_case(mix, num_q_heads=4, num_kv_heads=2, page_size=PAGE,
                     seed=3)
    poisoned_case, poisoned = _poison_outside(case, mix, window)
    assert poisoned >= 5
    kw = dict(sm_scale=0.125, sliding_window=window, logit_soft_cap=20.0)
    want = ragged_paged_attention_reference(*case, **kw)
    got = ragged_paged_attention(*poisoned_case, tuning=TUNING,
                                 interpret=INTERPRET, decode_only=decode_only,
                                 **kw)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5,
                               rtol=2e-5)
    # Reading the poisoned pages (as the reference does) shows as NaN.
    assert np.isnan(np.asarray(
        ragged_paged_attention_reference(*poisoned_case, **kw))).any()
