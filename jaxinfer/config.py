"""Engine configuration: one frozen, validated dataclass per concern, and
`EngineArgs`, which takes vLLM's argument names and builds them."""

from __future__ import annotations

import dataclasses
import os

from .errors import InvalidConfigError


def _check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise InvalidConfigError(f"{field} must be {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV page
    # Share of device memory the engine may use; on CPU, share of the host
    # memory available at start that the KV pages may take.
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None  # fixes the page count (tests)
    enable_prefix_caching: bool = True
    swap_space: float = 4.0  # GiB of host memory for swapped-out pages

    def __post_init__(self):
        _check(self.block_size in (8, 16, 32, 64, 128), "block_size",
               "one of 8, 16, 32, 64, 128", self.block_size)
        _check(0.0 < self.gpu_memory_utilization <= 1.0,
               "gpu_memory_utilization", "in (0, 1]", self.gpu_memory_utilization)
        _check(self.num_gpu_blocks_override is None
               or self.num_gpu_blocks_override >= 2, "num_gpu_blocks_override",
               ">= 2 (page 0 is reserved) or None", self.num_gpu_blocks_override)
        _check(self.swap_space >= 0, "swap_space", ">= 0 GiB", self.swap_space)


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
    budget = min(cache.gpu_memory_utilization * available_bytes,
                 CPU_KV_CACHE_MAX_BYTES)
    by_memory = int(budget // page_bytes) - 1
    if by_memory < per_seq:
        raise InvalidConfigError(
            f"no room for the KV cache on CPU: gpu_memory_utilization="
            f"{cache.gpu_memory_utilization} of {available_bytes / 2**30:.1f} "
            f"GiB available host memory (at most "
            f"{CPU_KV_CACHE_MAX_BYTES / 2**30:.0f} GiB) holds "
            f"{max(by_memory, 0)} pages of {cache.block_size} tokens, fewer "
            f"than one sequence of max_model_len={max_model_len} needs "
            f"({per_seq}): raise gpu_memory_utilization, set "
            "num_gpu_blocks_override, or lower max_model_len")
    return min(max_num_seqs * per_seq, by_memory) + 1


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_model_len: int  # longest prompt + output, in tokens
    max_num_seqs: int = 256  # sequences in one step
    max_num_batched_tokens: int = 2048  # tokens in one step
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority"
    preemption_mode: str = "recompute"  # "recompute" | "swap"

    def __post_init__(self):
        _check(self.max_model_len >= 1, "max_model_len", ">= 1",
               self.max_model_len)
        _check(self.max_num_seqs >= 1, "max_num_seqs", ">= 1", self.max_num_seqs)
        _check(self.max_num_batched_tokens >= self.max_num_seqs,
               "max_num_batched_tokens",
               f">= max_num_seqs ({self.max_num_seqs})",
               self.max_num_batched_tokens)
        _check(self.enable_chunked_prefill
               or self.max_num_batched_tokens >= self.max_model_len,
               "max_num_batched_tokens",
               f">= max_model_len ({self.max_model_len}) when chunked prefill "
               "is off", self.max_num_batched_tokens)
        _check(self.policy in ("fcfs", "priority"), "policy",
               "'fcfs' or 'priority'", self.policy)
        _check(self.preemption_mode in ("recompute", "swap"), "preemption_mode",
               "'recompute' or 'swap'", self.preemption_mode)


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1

    def __post_init__(self):
        _check(self.tensor_parallel_size >= 1, "tensor_parallel_size", ">= 1",
               self.tensor_parallel_size)


@dataclasses.dataclass
class EngineArgs:
    """vLLM's engine arguments (the same names and meanings)."""
    model: str = "smollm2-135m-instruct"
    tokenizer: str | None = None  # a model reference for the tokenizer; None = model's
    load_format: str = "auto"  # "auto" or "dummy" (random weights, config only)
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    swap_space: float = 4.0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    preemption_mode: str = "recompute"
    tensor_parallel_size: int = 1
    max_logprobs: int = 20
    # None: Pallas kernels on GPU (Triton lowering, models/attention.py says
    # why), reference on CPU; "pallas": Mosaic GPU kernels where they apply.
    attention_backend: str | None = None
    # Persistent XLA cache; None: $JAXINFER_COMPILATION_CACHE_DIR, else
    # ~/.cache/jaxinfer/xla (CPU included); "" = off.
    compilation_cache_dir: str | None = None
    warmup: bool = False  # compile every shape bucket at start

    def __post_init__(self):
        _check(isinstance(self.seed, int), "seed", "an integer", self.seed)
        _check(self.load_format in ("auto", "dummy"), "load_format",
               "'auto' or 'dummy'", self.load_format)
        _check(self.max_model_len is None or (
            isinstance(self.max_model_len, int) and self.max_model_len >= 1),
            "max_model_len", "a positive integer or None", self.max_model_len)
        for field in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, field)
            _check(value is None or (isinstance(value, int) and value >= 1),
                   field, "a positive integer or None", value)
        _check(self.max_logprobs >= 0, "max_logprobs", ">= 0", self.max_logprobs)

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            enable_prefix_caching=self.enable_prefix_caching,
            swap_space=self.swap_space)

    def scheduler_config(self, model_max_len: int, on_cpu: bool) -> SchedulerConfig:
        max_len = self.max_model_len
        if max_len is None:
            # On CPU a long default only costs compile time and memory.
            max_len = min(model_max_len, 2048 if on_cpu else model_max_len)
        elif max_len > model_max_len:
            raise InvalidConfigError(
                f"max_model_len ({max_len}) is larger than the model's "
                f"max_position_embeddings ({model_max_len})")
        # Fewer seats on CPU: the KV pool is sized for every seat at full
        # length and zeroed at start, which a first run waits for.
        max_seqs = self.max_num_seqs or (8 if on_cpu else 256)
        if self.max_num_seqs is None and self.max_num_batched_tokens:
            # The default seat count yields to an explicit token budget.
            max_seqs = min(max_seqs, self.max_num_batched_tokens)
        max_tokens = self.max_num_batched_tokens or max(
            256 if on_cpu else 2048, max_seqs)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens is None:
            max_tokens = max(max_tokens, max_len)
        return SchedulerConfig(
            max_model_len=max_len, max_num_seqs=max_seqs,
            max_num_batched_tokens=max_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            preemption_mode=self.preemption_mode)

    def parallel_config(self) -> ParallelConfig:
        return ParallelConfig(tensor_parallel_size=self.tensor_parallel_size)
