"""The reference's decode-only path (one query token per sequence, the CPU
engine's decode step) equals its general path on the same batch."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer.pallas_kernels.ragged_paged_attention_reference import (
    ragged_paged_attention_reference,
)
from tests.pallas_kernels.cases import make_case


@pytest.mark.parametrize("kw", [{}, {"sliding_window": 20},
                                {"logit_soft_cap": 5.0}])
@pytest.mark.parametrize("kv_lens", [[1], [17, 1, 129, 40], [33, 64, 5]])
def test_decode_only_equals_general_path(kv_lens, kw):
    case = make_case([(1, n) for n in kv_lens], num_q_heads=6, num_kv_heads=2,
                     pad_tokens=5, pad_seqs=2)
    scale = case[0].shape[-1] ** -0.5
    general = ragged_paged_attention_reference(*case, sm_scale=scale, **kw)
    decode = ragged_paged_attention_reference(*case, sm_scale=scale,
                                              decode_only=True, **kw)
    np.testing.assert_allclose(np.asarray(decode), np.asarray(general),
                               rtol=1e-5, atol=1e-6)
    assert not np.asarray(decode)[len(kv_lens):].any()  # padding rows zero
