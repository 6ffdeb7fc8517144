"""How many KV pages the pool holds: `num_kv_pages`, from the memory left
once the weights are placed (GPU), from `max_model_len` and `max_num_seqs`
(CPU, `cpu_num_blocks`), or as `num_gpu_blocks_override` asks; never
more than one layer's page array can address (`pages_per_array`)."""

from __future__ import annotations

import logging
import os

import jax

from ..config import CacheConfig
from ..errors import InvalidConfigError
from .kv_dtype import max_pages

logger = logging.getLogger(__name__)


def host_available_bytes() -> int:
    """Host memory free for new allocations (Linux: MemAvailable; elsewhere
    the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# At most this much KV cache on CPU unless num_gpu_blocks_override asks for
# more (vLLM's CPU backend defaults to the same 4 GiB): the pool is zeroed
# at start, and a host shares its memory with everything else.
CPU_KV_CACHE_MAX_BYTES = 4 << 30


def cpu_num_blocks(cache: CacheConfig, max_model_len: int, max_num_seqs: int,
                   page_bytes: int, available_bytes: int) -> int:
    """The CPU page pool: room for every seat at full length (more could
    never be used at once), capped by ``gpu_memory_utilization`` of the
    host memory available and by CPU_KV_CACHE_MAX_BYTES; at least one
    full-length sequence must fit. Page 0 is the null page."""
    per_seq = -(-max_model_len // cache.block_size)
    share = (0.9 if cache.gpu_memory_utilization is None
             else cache.gpu_memory_utilization)
    budget = min(share * available_bytes, CPU_KV_CACHE_MAX_BYTES)
    by_memory = int(budget // page_bytes) - 1
    if by_memory < per_seq:
        raise InvalidConfigError(
            f"no room for the KV cache on CPU: gpu_memory_utilization="
            f"{share} of {available_bytes / 2**30:.1f} "
            f"GiB available host memory (at most "
            f"{CPU_KV_CACHE_MAX_BYTES / 2**30:.0f} GiB) holds "
            f"{max(by_memory, 0)} pages of {cache.block_size} tokens, fewer "
            f"than one sequence of max_model_len={max_model_len} needs "
            f"({per_seq}): raise gpu_memory_utilization, set "
            "num_gpu_blocks_override, or lower max_model_len")
    return min(max_num_seqs * per_seq, by_memory) + 1



def pages_per_array(cfg, placement, block_size: int) -> int:
    """Pages a layer's page array may hold on one device (the kernels'
    32-bit offsets, `kv_dtype.max_pages`)."""
    heads_split = placement.kv_shards // placement.pipeline_stages
    return max_pages(block_size, max(1, cfg.num_kv_heads // heads_split),
                     cfg.head_dim)


def num_kv_pages(cfg, placement, cache_config, scheduler_config,
                 block_size: int, page_bytes: int, on_cpu: bool) -> int:
    """The pool's page count (``page_bytes``: one page across all layers,
    K and V, on one device)."""
    cc, sc = cache_config, scheduler_config
    cap = pages_per_array(cfg, placement, block_size)
    if cc.num_gpu_blocks_override is not None:
        if not on_cpu and cc.num_gpu_blocks_override > cap:
            raise InvalidConfigError(
                f"num_gpu_blocks_override={cc.num_gpu_blocks_override} "
                f"exceeds the {cap} pages one layer's page array can "
                "hold (the attention kernels' 32-bit offsets); ask for "
                "fewer")
        return cc.num_gpu_blocks_override
    if on_cpu:
        return cpu_num_blocks(cc, sc.max_model_len, sc.max_num_seqs,
                              page_bytes, host_available_bytes())
    util = 0.9 if cc.gpu_memory_utilization is None else cc.gpu_memory_utilization
    stats = jax.local_devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit", 0)
    in_use = stats.get("bytes_in_use", 0)
    # Headroom for the step's activations and logits at the largest bucket,
    # prompt logprobs' included: float32 logits of every row of the bucket
    # and their log-softmax (16.8 GB at 16384 rows of Gemma's 256000-entry
    # vocabulary), which warm-up compiles and a request may ask for.
    workspace = (sc.max_num_batched_tokens *
                 (cfg.hidden_size * 16 + cfg.intermediate_size * 8
                  + cfg.vocab_size * 2) *
                 4 + sc.max_num_seqs * cfg.vocab_size * 16 + (1 << 30))
    free = limit * util - in_use - workspace
    n = int(free // page_bytes)
    if n < 2:
        raise ValueError(
            f"no room for the KV cache: {limit / 2**30:.1f} GiB "
            f"device memory x gpu_memory_utilization={util} "
            f"leaves {free / 2**30:.2f} GiB after weights; raise "
            "gpu_memory_utilization or lower max_num_batched_tokens")
    if n > cap:
        logger.warning(
            "KV cache capped at %d pages (memory for %d): one layer's "
            "page array must stay under 2**31 elements for the "
            "attention kernels' 32-bit offsets", cap, n)
        n = cap
    return n
