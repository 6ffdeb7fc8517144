"""The CPU page pool: sized from max_model_len x max_num_seqs, capped by
gpu_memory_utilization of the host memory available (the flag is honoured on
CPU, not ignored), refused with a message when one sequence cannot fit."""

from __future__ import annotations

import pytest

from jaxinfer.config import CacheConfig, EngineArgs
from jaxinfer.errors import InvalidConfigError
from jaxinfer.worker.kv_pool_size import CPU_KV_CACHE_MAX_BYTES, cpu_num_blocks

PAGE = 1 << 20  # bytes per page, all layers


def test_pool_holds_every_seat_at_full_length_when_memory_allows():
    cc = CacheConfig(block_size=16)
    # 8 seats x 2048 tokens = 8 x 128 pages, plus the null page.
    assert cpu_num_blocks(cc, 2048, 8, PAGE, 64 << 30) == 8 * 128 + 1
    assert cpu_num_blocks(cc, 100, 3, PAGE, 64 << 30) == 3 * 7 + 1


def test_gpu_memory_utilization_caps_the_pool_on_cpu():
    big = cpu_num_blocks(CacheConfig(gpu_memory_utilization=0.9), 2048, 64,
                         PAGE, 1 << 30)
    small = cpu_num_blocks(CacheConfig(gpu_memory_utilization=0.3), 2048, 64,
                           PAGE, 1 << 30)
    assert big == int(0.9 * 1024)  # 921 pages of 1 MiB fit, null page included
    assert small == int(0.3 * 1024)
    assert small < big < 64 * 128 + 1


def test_pool_never_exceeds_the_cpu_cap_however_much_memory_is_free():
    n = cpu_num_blocks(CacheConfig(), 2048, 256, PAGE, 1 << 40)
    assert n == CPU_KV_CACHE_MAX_BYTES // PAGE


def test_too_little_memory_for_one_sequence_names_the_flag():
    cc = CacheConfig(gpu_memory_utilization=0.05)
    with pytest.raises(InvalidConfigError,
                       match="gpu_memory_utilization=0.05.*max_model_len=2048"):
        cpu_num_blocks(cc, 2048, 8, PAGE, 1 << 30)


def test_cpu_defaults_keep_the_pool_small():
    sc = EngineArgs().scheduler_config(8192, on_cpu=True)
    assert (sc.max_model_len, sc.max_num_seqs) == (2048, 8)
    assert EngineArgs(max_num_seqs=32).scheduler_config(
        8192, on_cpu=True).max_num_seqs == 32
