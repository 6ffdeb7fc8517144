"""BlockPool and KVCacheManager: prefix hits, eviction order, copy-on-write."""

from __future__ import annotations

import pytest

from jaxinfer.core.block_pool import BlockPool, hash_block
from jaxinfer.core.kv_cache_manager import KVCacheManager
from jaxinfer.request import Request
from jaxinfer.sampling_params import SamplingParams


def _req(rid, tokens, extra=None):
    return Request(rid, tokens, SamplingParams(max_tokens=4), (0,),
                   extra_keys=extra)


def _admit(kv, req):
    pages, hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - hit, pages)
    req.num_computed_tokens = req.num_tokens
    return hit


def test_hash_chains_over_the_prefix():
    a = hash_block(None, [1, 2])
    assert hash_block(a, [3, 4]) != hash_block(hash_block(None, [9, 9]), [3, 4])
    assert hash_block(None, [1, 2], ("lora", 1)) != a


def test_null_page_never_allocated_and_double_free_caught():
    pool = BlockPool(4)
    pages = pool.allocate(3)
    assert 0 not in pages and pool.num_free == 0
    pool.free(pages)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([pages[0]])


def test_prefix_hit_skips_full_blocks_but_not_the_last_token():
    kv = KVCacheManager(32, 4)
    a = _req("a", list(range(1, 13)))  # 3 full blocks
    assert _admit(kv, a) == 0
    b = _req("b", list(range(1, 13)))  # identical prompt
    pages, hit = kv.get_computed_blocks(b)
    assert hit == 8, "the last block holds the last prompt token: recomputed"
    assert pages == kv.block_table("a")[:2]
    c = _req("c", list(range(1, 9)) + [99, 98, 97])
    assert _admit(kv, c) == 8
    assert kv.block_table("c")[:2] == kv.block_table("a")[:2]
    assert kv.pool.ref_cnt[kv.block_table("a")[0]] == 2
    d = _req("d", list(range(1, 13)), extra=("lora", 7))
    assert kv.get_computed_blocks(d) == ([], 0), "extra keys separate caches"


def test_cached_pages_evicted_only_when_free_pages_run_out_lru():
    kv = KVCacheManager(9, 4)  # 8 usable pages
    a = _req("a", list(range(1, 10)))  # 3 pages, 2 full
    _admit(kv, a)
    kv.free(a)
    assert kv.pool.num_free_cached == 2
    b = _req("b", list(range(50, 70)))  # 5 pages: fits without eviction
    _admit(kv, b)
    assert kv.pool.num_evictions == 0 and kv.pool.num_free_cached == 2
    c = _req("c", [7, 7, 7, 7, 7])  # 2 pages: one plain left, then evict one
    _admit(kv, c)
    assert kv.pool.num_evictions == 1
    # The tail block of a's prefix was freed first, so it went first.
    again = _req("a2", list(range(1, 10)))
    assert kv.get_computed_blocks(again)[1] == 4


def test_swap_out_and_in_round_trip_pages():
    kv = KVCacheManager(8, 4, num_host_blocks=4)
    a = _req("a", list(range(1, 11)))
    _admit(kv, a)
    table = list(kv.block_table("a"))
    out = kv.swap_out(a)
    assert [d for d, _ in out] == table and kv.pool.num_free == 7
    a.append_output_token(5)
    back = kv.swap_in(a, 1)
    assert [s for _, s in back] == [s for _, s in out]
    assert kv.host.num_free == 4 and len(kv.block_table("a")) == 3
    small_host = KVCacheManager(8, 4, num_host_blocks=2)
    b = _req("b", list(range(1, 11)))
    _admit(small_host, b)
    assert small_host.swap_out(b) is None, "3 pages do not fit 2 host slots"
    assert len(small_host.block_table("b")) == 3
