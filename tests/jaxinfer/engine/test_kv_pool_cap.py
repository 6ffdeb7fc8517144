"""The GPU page pool stays within what the attention kernels can address:
a layer's page array under 2**31 elements (kv_dtype.max_pages). On the
H200 an 8-layer model with fp8 pages at gpu_memory_utilization=0.5 (3.3e9
elements per array) faulted with an illegal address; at 0.2 it ran."""

from __future__ import annotations

import os
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


def _card(monkeypatch, total_gib, fraction):
    """A card of ``total_gib`` whose XLA allocator was given ``fraction``."""
    limit = int(total_gib * fraction) << 30
    dev = types.SimpleNamespace(memory_stats=lambda: {
        "bytes_limit": limit, "bytes_in_use": 16 << 30})
    monkeypatch.setattr(jax, "local_devices", lambda: [dev])
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", str(fraction))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)


def _pool(utilization):
    runner = _runner()
    runner.cache_config = CacheConfig(gpu_memory_utilization=utilization)
    runner.page_bytes = 2 << 20  # llama3-8b's 16-token page, all layers
    return ModelRunner._num_blocks(runner)


def test_gpu_memory_utilization_is_a_share_of_the_whole_card(monkeypatch):
    """vLLM's meaning: 0.9 of an 80 GiB card is 72 GiB for weights, pages
    and workspace, not 0.9 of the 60 GiB XLA's allocator takes by default."""
    from jaxinfer.worker import kv_pool_size
    margin = 1 - kv_pool_size.ALLOCATOR_MARGIN
    _card(monkeypatch, 80, 0.9)  # the allocator was given the share
    full = _pool(0.9)
    _card(monkeypatch, 80, 0.75)  # JAX started before the engine
    capped = _pool(0.9)
    half = _pool(0.5)
    page = 2 << 20
    # The pools differ by the budgets' difference, in pages.
    assert full - capped == pytest.approx(
        ((min(72, 80 * 0.9 * margin) - 60 * margin) * 2**30) / page, abs=1)
    assert capped - half == pytest.approx(
        ((60 * margin - 40) * 2**30) / page, abs=1)


def test_the_engine_gives_xla_the_share_before_the_backend_starts(monkeypatch):
    from jax._src import xla_bridge

    from jaxinfer.worker.kv_pool_size import claim_device_memory
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    assert claim_device_memory(0.8)
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.8000"
    # The user's own fraction stands.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    assert not claim_device_memory(None)
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    # Once JAX's backends run, the allocator's limit is fixed.
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: True)
    assert not claim_device_memory(None)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ


def test_the_workspace_reserves_prompt_logprobs_for_the_rows_a_step_scores(
        monkeypatch):
    """Under chunked prefill a step scores at most max_prompt_logprob_rows
    prompt tokens, so the pool keeps room for that many rows of float32
    logits and their log-softmax, not for the whole token budget."""
    from jaxinfer.config import PROMPT_LOGPROB_MAX_ROWS
    _card(monkeypatch, 141, 0.9)

    def pool(chunked):
        runner = _runner()
        runner.cache_config = CacheConfig(gpu_memory_utilization=0.9)
        runner.scheduler_config = SchedulerConfig(
            max_num_batched_tokens=16384, max_num_seqs=32, max_model_len=2048,
            enable_chunked_prefill=chunked)
        runner.page_bytes = 2 << 20
        return ModelRunner._num_blocks(runner)
    assert SchedulerConfig(max_model_len=2048, max_num_batched_tokens=16384
                           ).max_prompt_logprob_rows == PROMPT_LOGPROB_MAX_ROWS
    rows_saved = 16384 - PROMPT_LOGPROB_MAX_ROWS
    assert pool(True) - pool(False) == pytest.approx(
        rows_saved * 49152 * 8 / (2 << 20), abs=1)
