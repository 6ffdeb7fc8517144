"""The step's int32 metadata travels as one buffer and unpacks exactly."""

from __future__ import annotations

import numpy as np

from jaxinfer.models import AttentionMetadata
from jaxinfer.worker.packing import pack_step, unpack_step


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(0)
    T, S, P = 16, 4, 8
    r = lambda *shape: rng.integers(0, 1000, shape, dtype=np.int32)
    ids, pos = r(T), r(T)
    md = AttentionMetadata(r(T), r(S, P), r(S), r(S + 1), r(1))
    packed = pack_step(ids, pos, md)
    assert packed.dtype == np.int32 and packed.shape == (3 * T + S * P + 2 * S + 2,)
    ids2, pos2, md2 = unpack_step(packed, (T, S, P))
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(pos2, pos)
    for f in ("slot_mapping", "block_tables", "kv_lens", "cu_q_lens", "num_seqs"):
        np.testing.assert_array_equal(getattr(md2, f), getattr(md, f))
