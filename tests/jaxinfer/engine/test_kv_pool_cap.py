"""The GPU page pool stays within what the attention kernels can address:
a layer's page array under 2**31 elements (kv_dtype.max_pages). On the
H200 an 8-layer model with fp8 pages at gpu_memory_utilization=0.5 (3.3e9
elements per array) faulted with an illegal address; at 0.2 it ran."""

from __future__ import annotations

import types

import jax
import pytest

from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.errors import InvalidConfigError
from jaxinfer.worker import kv_dtype
from jaxinfer.worker.model_runner import ModelRunner


def test_max_pages_keeps_a_layer_array_under_2_31_elements():
    n = kv_dtype.max_pages(16, 4, 128)
    assert n * 4 * 16 * 128 <= 2**31 - 1 < (n + 1) * 4 * 16 * 128


def _runner(override=None, kv_heads=4, kv_shards=1, stages=1):
    cfg = types.SimpleNamespace(num_kv_heads=kv_heads, head_dim=128,
                                hidden_size=2048, intermediate_size=5632,
                                vocab_size=49152)
    runner = types.SimpleNamespace(
        cache_config=CacheConfig(gpu_memory_utilization=0.5,
                                 num_gpu_blocks_override=override),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=2048,
                                         max_num_seqs=32, max_model_len=2048),
        cfg=cfg, on_cpu=False, block_size=16, page_bytes=128 << 10,
        placement=types.SimpleNamespace(kv_shards=kv_shards,
                                        pipeline_stages=stages))
    runner.max_pages_per_array = lambda: ModelRunner.max_pages_per_array(
        runner)
    return runner


@pytest.fixture
def h200_memory(monkeypatch):
    dev = types.SimpleNamespace(memory_stats=lambda: {
        "bytes_limit": 105 << 30, "bytes_in_use": 3 << 30})
    monkeypatch.setattr(jax, "local_devices", lambda: [dev])


def test_the_pool_is_capped_where_memory_would_overflow_the_offsets(
        h200_memory, caplog):
    runner = _runner()
    cap = kv_dtype.max_pages(16, 4, 128)
    with caplog.at_level("WARNING"):
        assert ModelRunner._num_blocks(runner) == cap
    assert "capped" in caplog.text
    # Split over two devices by kv heads, each array holds half the heads:
    # twice the pages fit under the same bound.
    assert ModelRunner.max_pages_per_array(_runner(kv_shards=2)) == \
        kv_dtype.max_pages(16, 2, 128)


def test_an_override_past_the_bound_is_refused_with_the_bound():
    with pytest.raises(InvalidConfigError, match="32-bit offsets"):
        ModelRunner._num_blocks(_runner(override=10**6))
    assert ModelRunner._num_blocks(_runner(override=1000)) == 1000
