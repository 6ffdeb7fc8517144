"""How many KV pages the pool holds: `num_kv_pages`, from the memory left
once the weights are placed (GPU), from `max_model_len` and `max_num_seqs`
(CPU, `cpu_num_blocks`), or as `num_gpu_blocks_override` asks; never
more than one layer's page array can address (`pages_per_array`)."""

from __future__ import annotations

import logging
import os

import jax

from ..config import CacheConfig, gpu_memory_bytes
from ..errors import InvalidConfigError
from .kv_dtype import max_pages

logger = logging.getLogger(__name__)


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Left inside the allocator's limit beside the pool and the step's
# workspace: the allocator's own fragmentation and small buffers.
ALLOCATOR_MARGIN = 0.03


def resolved_utilization(utilization: float | None) -> float:
    """``gpu_memory_utilization``, or its default when unset."""
    return DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization


def claim_device_memory(utilization: float | None) -> bool:
    """Let XLA's allocator take the share of the card that
    ``gpu_memory_utilization`` names, as vLLM reads that flag (a share of the
    whole device). XLA's GPU client otherwise keeps to 0.75 of it
    (XLA_PYTHON_CLIENT_MEM_FRACTION), which would leave a quarter of the card
    to nothing. Only possible before JAX starts its backends, and only where
    the user has not chosen the fraction or another allocator; returns
    whether it set the fraction."""
    from jax._src import xla_bridge
    if ("XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ
            or "XLA_PYTHON_CLIENT_ALLOCATOR" in os.environ
            or xla_bridge.backends_are_initialized()):
        return False
    share = resolved_utilization(utilization)
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{share:.4f}"
    return True


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
    share = resolved_utilization(cache.gpu_memory_utilization)
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
    util = resolved_utilization(cc.gpu_memory_utilization)
    stats = jax.local_devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit", 0)
    in_use = stats.get("bytes_in_use", 0)
    # vLLM's meaning: a share of the whole device, weights included; XLA's
    # allocator cannot hand out more than its own limit (a smaller
    # XLA_PYTHON_CLIENT_MEM_FRACTION, or JAX started before the engine).
    total = gpu_memory_bytes()
    budget = min(util * total, limit * (1 - ALLOCATOR_MARGIN))
    if util * total > limit * (1 - ALLOCATOR_MARGIN) + (1 << 30):
        logger.info(
            "KV pool sized within XLA's allocator limit (%.1f GiB of %.1f): "
            "gpu_memory_utilization=%s asks for %.1f GiB; set "
            "XLA_PYTHON_CLIENT_MEM_FRACTION=%s before JAX starts to give it "
            "that", limit / 2**30, total / 2**30, util,
            util * total / 2**30, util)
    # Headroom for the step's activations at the largest bucket, the
    # sampled rows' logits, and prompt logprobs' float32 logits and their
    # log-softmax over the rows one step may score
    # (SchedulerConfig.max_prompt_logprob_rows), which warm-up compiles and
    # a request may ask for.
    workspace = (sc.max_num_batched_tokens *
                 (cfg.hidden_size * 16 + cfg.intermediate_size * 8) * 4
                 + sc.max_prompt_logprob_rows * cfg.vocab_size * 8
                 + sc.max_num_seqs * cfg.vocab_size * 16 + (1 << 30))
    free = budget - in_use - workspace
    n = int(free // page_bytes)
    if n < 2:
        raise ValueError(
            f"no room for the KV cache: gpu_memory_utilization={util} of "
            f"{total / 2**30:.1f} GiB device memory (XLA's allocator limit "
            f"{limit / 2**30:.1f} GiB) leaves {free / 2**30:.2f} GiB after "
            f"the weights and the step's workspace; raise "
            "gpu_memory_utilization or lower max_num_batched_tokens")
    if n > cap:
        logger.warning(
            "KV cache capped at %d pages (memory for %d): one layer's "
            "page array must stay under 2**31 elements for the "
            "attention kernels' 32-bit offsets", cap, n)
        n = cap
    return n
