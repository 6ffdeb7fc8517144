"""The step's int32 metadata travels as one buffer and unpacks exactly."""

from __future__ import annotations

import numpy as np

from jaxinfer.models import AttentionMetadata
from jaxinfer.worker.packing import pack_step, unpack_step


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(0)
    T, S, P = 16, 4, 8
    pool = iter(rng.permutation(100_000).astype(np.int32) + 1)  # all distinct
    r = lambda *shape: np.fromiter(pool, np.int32, int(np.prod(shape))).reshape(shape)
    ids, pos = r(T), r(T)
    md = AttentionMetadata(r(T), r(S, P), r(S), r(S + 1), r(1))
    packed = pack_step(ids, pos, md)
    assert packed.dtype == np.int32
    # Each field starts on a 256-byte boundary (Mosaic GPU operands).
    starts = [np.flatnonzero(packed == v.reshape(-1)[0])[0] for v in (
        ids, pos, md.slot_mapping, md.block_tables, md.kv_lens, md.cu_q_lens)]
    assert all(s * 4 % 256 == 0 for s in starts), starts
    ids2, pos2, md2 = unpack_step(packed, (T, S, P, True))
    assert md2.decode_only is True  # the static flag rides in dims
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(pos2, pos)
    for f in ("slot_mapping", "block_tables", "kv_lens", "cu_q_lens", "num_seqs"):
        np.testing.assert_array_equal(getattr(md2, f), getattr(md, f))
