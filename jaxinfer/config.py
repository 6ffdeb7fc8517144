"""Engine configuration: one frozen, validated dataclass per concern, and
`EngineArgs`, which takes vLLM's argument names and builds them."""

from __future__ import annotations

import dataclasses

from .errors import InvalidConfigError


def _check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise InvalidConfigError(f"{field} must be {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV page
    gpu_memory_utilization: float = 0.9  # share of device memory the engine may use
    num_gpu_blocks_override: int | None = None  # fixes the page count (tests, CPU)
    enable_prefix_caching: bool = True
    swap_space: float = 4.0  # GiB of host memory for swapped-out pages
    cpu_num_blocks: int = 2048  # page count on CPU when not overridden

    def __post_init__(self):
        _check(self.block_size in (8, 16, 32, 64, 128), "block_size",
               "one of 8, 16, 32, 64, 128", self.block_size)
        _check(0.0 < self.gpu_memory_utilization <= 1.0,
               "gpu_memory_utilization", "in (0, 1]", self.gpu_memory_utilization)
        _check(self.num_gpu_blocks_override is None
               or self.num_gpu_blocks_override >= 2, "num_gpu_blocks_override",
               ">= 2 (page 0 is reserved) or None", self.num_gpu_blocks_override)
        _check(self.swap_space >= 0, "swap_space", ">= 0 GiB", self.swap_space)


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
    # ~/.cache/jaxinfer/xla on accelerators and none on CPU; "" = off.
    compilation_cache_dir: str | None = None
    warmup: bool = False  # compile every shape bucket at start
    # A file to write the step timeline to (one JSON line per step:
    # jaxinfer/engine/step_timeline.py); None = no timeline.
    profile_steps: str | None = None
    # Host/device overlap (vLLM's async scheduling): the next step is
    # scheduled and enqueued while the device runs this one.
    async_scheduling: bool = True

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
        _check(isinstance(self.tensor_parallel_size, int)
               and self.tensor_parallel_size >= 1, "tensor_parallel_size",
               "a positive integer", self.tensor_parallel_size)

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
        max_seqs = self.max_num_seqs or (32 if on_cpu else 256)
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
