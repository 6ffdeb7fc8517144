"""Engine configuration: one frozen, validated dataclass per concern, and
`EngineArgs`, which takes vLLM's argument names and builds them."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

from .errors import InvalidConfigError, UnsupportedFeatureError, UnsupportedQuantizationError

if TYPE_CHECKING:
    from .distributed.parallel_config import ParallelConfig
    from .lora.config import LoRAConfig
    from .models.config import ModelConfig
    from .spec_decode.config import SpeculativeConfig

# vLLM's kv_cache_dtype values served (worker/kv_dtype.py has the dtypes).
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def _check(cond: bool, field: str, allowed: str, value: Any) -> None:
    if not cond:
        raise InvalidConfigError(f"{field} must be {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV page
    # Share of device memory the engine may use; None: 0.9. On CPU, the
    # share of the host memory available at start that the KV pages may take
    # (cpu_num_blocks).
    gpu_memory_utilization: float | None = None
    num_gpu_blocks_override: int | None = None  # fixes the page count (tests)
    enable_prefix_caching: bool = True
    swap_space: float = 4.0  # GiB of host memory for swapped-out pages
    # vLLM's kv_cache_dtype: "auto" (the model's), "bfloat16", "fp8" /
    # "fp8_e4m3", "fp8_e5m2" (worker/kv_dtype.py)
    cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _check(self.block_size in (8, 16, 32, 64, 128), "block_size",
               "one of 8, 16, 32, 64, 128", self.block_size)
        _check(self.gpu_memory_utilization is None
               or 0.0 < self.gpu_memory_utilization <= 1.0,
               "gpu_memory_utilization", "in (0, 1] or None",
               self.gpu_memory_utilization)
        _check(self.num_gpu_blocks_override is None
               or self.num_gpu_blocks_override >= 2, "num_gpu_blocks_override",
               ">= 2 (page 0 is reserved) or None", self.num_gpu_blocks_override)
        _check(self.swap_space >= 0, "swap_space", ">= 0 GiB", self.swap_space)
        _check(self.cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype",
               f"one of {', '.join(KV_CACHE_DTYPES)}", self.cache_dtype)


# vLLM's batch capacity on a GPU of at least 70 GiB: 1024 sequences, and
# batched tokens by usage context (offline `LLM` or the OpenAI server).
# Smaller GPUs keep 256 sequences and 8192 tokens. The KV pages bound the
# sequences that actually run: each holds at least one page.
LARGE_GPU_BYTES = 70 * 2**30
LARGE_GPU_MAX_NUM_SEQS = 1024
LARGE_GPU_MAX_NUM_BATCHED_TOKENS = {"llm": 16384, "server": 8192}
USAGE_CONTEXTS = tuple(LARGE_GPU_MAX_NUM_BATCHED_TOKENS)


# Prompt-logprob rows per step under chunked prefill
# (SchedulerConfig.max_prompt_logprob_rows).
PROMPT_LOGPROB_MAX_ROWS = 2048


def gpu_memory_bytes() -> int:
    """The first device's memory: XLA's allocator limit over the share of
    memory it was given (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set;
    the platform allocator has no such share)."""
    import jax
    stats = jax.local_devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit", 0)
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") == "platform":
        return limit
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
    return int(limit / fraction) if fraction > 0 else limit


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_model_len: int  # longest prompt + output, in tokens
    max_num_seqs: int = 256  # sequences in one step
    max_num_batched_tokens: int = 2048  # tokens in one step
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority"
    preemption_mode: str = "recompute"  # "recompute" | "swap"
    # Decode steps one program runs when every running request only
    # decodes (vLLM's multi-step scheduling); 1 = one step per program.
    num_scheduler_steps: int = 1

    @property
    def max_prompt_logprob_rows(self) -> int:
        """Prompt tokens one step scores for prompt logprobs, all requests
        together: their float32 logits over the whole vocabulary and the
        log-softmax of them are the step's largest buffers (16.8 GB at
        16,384 rows of a 256,000-entry vocabulary), and the pool reserves
        room for them. With chunked prefill a prompt that asks for them
        goes in chunks of at most this many tokens; without it the whole
        step's budget may be scored."""
        if not self.enable_chunked_prefill:
            return self.max_num_batched_tokens
        return min(self.max_num_batched_tokens, PROMPT_LOGPROB_MAX_ROWS)

    def __post_init__(self) -> None:
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
        _check(self.num_scheduler_steps >= 1, "num_scheduler_steps", ">= 1",
               self.num_scheduler_steps)


def _arg(default: Any, help: str, **cli: Any) -> Any:
    """An EngineArgs field with what its CLI flag needs (``cli.py`` builds
    every engine flag from these): ``help``, and optionally ``choices`` and
    ``aliases`` (extra flag spellings such as ``-tp``)."""
    return dataclasses.field(default=default, metadata={"help": help, **cli})


@dataclasses.dataclass
class EngineArgs:
    """vLLM's engine arguments (the same names and meanings). Each field is
    also a flag of ``jaxinfer serve`` / ``generate`` (``--max-num-seqs`` for
    ``max_num_seqs``); vLLM arguments that are not fields here are listed,
    with what jaxinfer does with them, in ``jaxinfer/compat/``."""
    model: str = _arg("smollm2-135m-instruct",
                      "a local HF folder, a .gguf file, an orbax folder "
                      "written by `jaxinfer convert`, or an embedded model name")
    tokenizer: str | None = _arg(
        None, "where the tokenizer comes from: a model reference or a folder "
        "holding only tokenizer files (default: the model's)")
    load_format: str = _arg("auto", "dummy: random weights from the model's "
                            "config.json", choices=("auto", "dummy"))
    quantization: str | None = _arg(
        None, "how the linear layers' weights are stored: awq / gptq (int4 "
        "or int8 group-quantized checkpoints; awq_marlin, gptq_marlin "
        "alike), fp8 (e4m3 weights with scales from the checkpoint, or "
        "quantized at load; fp8 matmuls), int8 (weight-only, per channel, "
        "quantized at load; tpu_int8 alike), gguf (keep a .gguf file's "
        "Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks quantized), compressed-tensors "
        "(fp8 ones); default: the checkpoint's own quantization_config",
        aliases=("-q",))
    kv_cache_dtype: str = _arg(
        "auto", "KV page dtype: auto (the model's dtype), bfloat16, fp8 / "
        "fp8_e4m3 or fp8_e5m2 (one byte per element, one scale per kv head "
        "and page: twice the pages of bf16 in the same memory)")
    dtype: str = _arg("auto", "weights and activations; auto: the "
                      "checkpoint's", choices=("auto", "float32", "bfloat16",
                                               "float16", "half", "float"))
    seed: int = _arg(0, "seed of the engine's sampling streams")
    max_model_len: int | None = _arg(
        None, "longest prompt + output in tokens (default: the model's, "
        "stretched by its RoPE scaling factor as vLLM does; 2048 at most on CPU)")
    block_size: int = _arg(16, "tokens per KV page",
                           choices=(8, 16, 32, 64, 128))
    gpu_memory_utilization: float | None = _arg(
        None, "share of the whole device's memory the engine may use, "
        "weights + KV pages + workspace, as in vLLM (default 0.9); on CPU, "
        "the share of available host memory the KV pages may take (the pool "
        "holds every seat at full length, 4 GiB at most)")
    num_gpu_blocks_override: int | None = _arg(
        None, "fixes the number of KV pages (overrides the memory sizing)")
    enable_prefix_caching: bool = _arg(True, "reuse KV pages of shared prompt "
                                       "prefixes")
    swap_space: float | None = _arg(
        None, "GiB of host memory for pages of preempted requests; giving it "
        "turns on swap preemption (default: 4 with --preemption-mode swap, "
        "else no host pool)")
    max_num_seqs: int | None = _arg(
        None, "sequences in one step (default: 1024 on a GPU of 70 GiB or "
        "more, else 256 on GPU, 8 on CPU)")
    max_num_batched_tokens: int | None = _arg(
        None, "tokens in one step (default: on a GPU of 70 GiB or more "
        "16384 offline and 8192 for the server, else 8192 on GPU, 256 on "
        "CPU)")
    usage_context: str = _arg(
        "llm", "which of vLLM's large-GPU defaults of max_num_batched_tokens "
        "apply: llm (offline) or server (`serve` sets it)",
        choices=USAGE_CONTEXTS)
    enable_chunked_prefill: bool = _arg(True, "split long prompts over steps")
    scheduling_policy: str = _arg(
        "fcfs", "fcfs: arrival order; priority: lower `priority` first "
        "(requests may then set priority)", choices=("fcfs", "priority"))
    preemption_mode: str | None = _arg(
        None, "what happens to a request that loses its pages: recompute, or "
        "swap them to host memory (default: swap when --swap-space is given, "
        "else recompute)", choices=("recompute", "swap"))
    tensor_parallel_size: int = _arg(1, "devices the model is split over",
                                     aliases=("-tp",))
    # Past one device group (jaxinfer/distributed/parallel_config.py).
    pipeline_parallel_size: int = _arg(
        1, "stages the layers are split into (consecutive layers per stage, "
        "each stage over --tensor-parallel-size devices)", aliases=("-pp",))
    data_parallel_size: int = _arg(
        1, "engine replicas on disjoint devices behind one front, which "
        "sends each request to the replica holding its prefix, else the "
        "least loaded", aliases=("-dp",))
    distributed_executor_backend: str | None = _arg(
        None, "how the processes start: uni/mp (default): one process "
        "drives this host's devices, several hosts launched by you with "
        "--distributed-coordinator, --num-processes, --process-id; "
        "external_launcher: the same with JAX's cluster auto-detection "
        "(SLURM, Open MPI, Kubernetes); ray: Ray places one worker process "
        "per host or GPU", choices=("uni", "mp", "ray", "external_launcher"))
    worker_use_ray: bool = _arg(
        False, "the same as --distributed-executor-backend ray (vLLM's "
        "older flag)")
    distributed_coordinator: str | None = _arg(
        None, "process 0's address for jax.distributed (several processes "
        "form one engine; process 0 schedules and serves)",
        metavar="HOST:PORT")
    num_processes: int | None = _arg(
        None, "processes of one multi-process engine (with "
        "--distributed-coordinator and --process-id)")
    process_id: int | None = _arg(
        None, "this process's index, 0 .. num_processes - 1; processes "
        "other than 0 run process 0's steps and serve no HTTP")
    max_logprobs: int = _arg(20, "the most logprobs a request may ask for "
                             "(-1: the whole vocabulary)")
    # None: Pallas kernels on GPU (Triton lowering, models/attention.py says
    # why), reference on CPU; "pallas": Mosaic GPU kernels where they apply.
    attention_backend: str | None = _arg(
        None, "default: pallas on GPU (Mosaic GPU kernels on Hopper, Triton "
        "elsewhere), reference on CPU; pallas_triton keeps both kernels on "
        "the Triton lowering; a *_xla_rope backend leaves RoPE and the K/V "
        "write to XLA instead of one kernel",
        choices=("reference", "pallas", "pallas_triton", "pallas_interpret",
                 "pallas_xla_rope", "pallas_interpret_xla_rope"))
    # Persistent XLA cache; None: $JAXINFER_COMPILATION_CACHE_DIR, else
    # ~/.cache/jaxinfer/xla (CPU included); "" = off.
    compilation_cache_dir: str | None = _arg(
        None, "persistent XLA compilation cache ('' = off; default: "
        "$JAXINFER_COMPILATION_CACHE_DIR, else ~/.cache/jaxinfer/xla)")
    warmup: bool | None = _arg(
        None, "compile every step program at start, before the first "
        "request (default: on for GPUs, off on CPU, where a first command "
        "starts faster compiling lazily; `serve` turns it on)")
    profile_steps: str | None = _arg(
        None, "write the step timeline to this file (one JSON line per step: "
        "jaxinfer/engine/step_timeline.py; benchmarks/timeline_report.py "
        "reads it)", metavar="FILE")
    async_scheduling: bool = _arg(
        True, "host/device overlap: the next step is scheduled and enqueued "
        "while the device runs this one (vLLM's async scheduling; on by "
        "default here)")
    num_scheduler_steps: int = _arg(
        1, "decode steps per device program while every running request "
        "only decodes and none needs the host between tokens (no logprobs, "
        "penalties or bad words, min_tokens reached; vLLM's multi-step "
        "scheduling): the host reads k tokens per round trip, streams get "
        "them k at a time")
    speculative_config: str | dict | None = _arg(
        None, "speculative decoding as JSON with vLLM's keys, e.g. "
        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
        "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}'; methods "
        "ngram, draft_model, eagle and eagle3 (docs/speculative-decoding.md)")
    limit_mm_per_prompt: str | dict[str, int] | None = _arg(
        None, "most images one prompt may carry, as JSON such as "
        "'{\"image\": 2}' (default 999, as vLLM)")
    allowed_local_media_path: str = _arg(
        "", "a folder whose files requests may name as file:// image URLs "
        "(default: none; remote URLs are never fetched)")
    enable_lora: bool = _arg(False, "serve LoRA adapters (a LoRARequest per "
                             "request; the server's --lora-modules)")
    max_loras: int = _arg(1, "LoRA adapters in one step (device slots)")
    max_lora_rank: int = _arg(16, "the largest LoRA rank served; every slot "
                              "is this wide")
    max_cpu_loras: int | None = _arg(
        None, "LoRA adapters kept in host memory (default: max_loras); "
        "adapters of running requests are always kept")
    # Structured outputs (jaxinfer/structured/): llguidance is the one
    # grammar library; vLLM's names for choosing it are taken.
    guided_decoding_backend: str = _arg(
        "auto", "structured outputs' grammar library: auto, guidance or "
        "llguidance (all name llguidance, the one served)")
    structured_outputs_config: str | None = _arg(
        None, "structured outputs' settings as JSON, e.g. "
        "'{\"backend\": \"guidance\"}' (backend only)")
    # Pooling (jaxinfer/pooling/): vLLM's runner, and its older names.
    runner: str = _arg(
        "auto", "generate: text generation; pooling: embeddings (LLM.embed, "
        "/v1/embeddings, /pooling, /score); auto: generate",
        choices=("auto", "generate", "pooling"))
    task: str | None = _arg(
        None, "vLLM's older name for the runner: embed (also embedding, "
        "score, encode) is runner pooling; generate is runner generate")
    convert: str = _arg(
        "auto", "embed: serve a generative model as an embedder (the same "
        "as --runner pooling)", choices=("auto", "none", "embed"))

    def __post_init__(self) -> None:
        _check(isinstance(self.seed, int), "seed", "an integer", self.seed)
        _check(self.load_format in ("auto", "dummy"), "load_format",
               "'auto' or 'dummy'", self.load_format)
        if self.quantization is not None:
            check_quantization("quantization", self.quantization)
        check_kv_cache_dtype("kv_cache_dtype", self.kv_cache_dtype)
        _check(self.max_model_len is None or (
            isinstance(self.max_model_len, int) and self.max_model_len >= 1),
            "max_model_len", "a positive integer or None", self.max_model_len)
        for field in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, field)
            _check(value is None or (isinstance(value, int) and value >= 1),
                   field, "a positive integer or None", value)
        _check(self.usage_context in USAGE_CONTEXTS, "usage_context",
               f"one of {', '.join(USAGE_CONTEXTS)}", self.usage_context)
        _check(self.max_logprobs >= -1, "max_logprobs",
               ">= 0, or -1 for the whole vocabulary", self.max_logprobs)
        _check(isinstance(self.tensor_parallel_size, int)
               and self.tensor_parallel_size >= 1, "tensor_parallel_size",
               "a positive integer", self.tensor_parallel_size)
        _check(self.preemption_mode in (None, "recompute", "swap"),
               "preemption_mode", "'recompute', 'swap' or None",
               self.preemption_mode)
        if self.preemption_mode == "recompute" and self.swap_space:
            # Nothing would use the pool: say so rather than allocate it.
            raise InvalidConfigError(
                f"swap_space ({self.swap_space} GiB) sizes the host pool of "
                "preemption_mode='swap', but preemption_mode is 'recompute': "
                "drop swap_space or set preemption_mode='swap'")
        if self.preemption_mode == "swap" and self.swap_space is not None:
            _check(self.swap_space > 0, "swap_space",
                   "> 0 GiB with preemption_mode='swap'", self.swap_space)
        from .multimodal.limits import parse_limit_mm_per_prompt
        self.limit_mm_per_prompt = parse_limit_mm_per_prompt(
            self.limit_mm_per_prompt)
        _check(not self.allowed_local_media_path
               or os.path.isdir(self.allowed_local_media_path),
               "allowed_local_media_path", "an existing folder (or empty)",
               self.allowed_local_media_path)
        self.lora_config()  # validates the LoRA fields
        self.parallel_config()  # typed errors for the parallel flags
        self._check_structured_outputs()
        self.runner_kind()  # typed errors for runner / task / convert
        if self.speculative() is not None and self.num_scheduler_steps > 1:
            raise InvalidConfigError(
                f"num_scheduler_steps={self.num_scheduler_steps} with "
                "speculative_config: a speculative step already emits "
                "several tokens; use num_scheduler_steps=1")

    def speculative(self) -> SpeculativeConfig | None:
        """The validated speculative config (None: off)."""
        from .spec_decode.config import parse_speculative_config
        return parse_speculative_config(self.speculative_config)

    def runner_kind(self) -> str:
        """"generate" or "pooling" (jaxinfer/pooling/runner_choice.py)."""
        from .pooling.runner_choice import resolve_runner
        return resolve_runner(self)

    def _check_structured_outputs(self) -> None:
        from .structured.params import check_backend
        try:
            check_backend("guided_decoding_backend",
                          self.guided_decoding_backend)
        except UnsupportedFeatureError:
            raise
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None
        cfg = self.structured_outputs_config
        if cfg is None:
            return
        if isinstance(cfg, str):
            try:
                cfg = json.loads(cfg)
            except ValueError:
                cfg = None
        if not isinstance(cfg, dict) or set(cfg) - {"backend"}:
            raise InvalidConfigError(
                "structured_outputs_config must be a JSON object with at most "
                f"a 'backend' key, got {self.structured_outputs_config!r}")
        try:
            check_backend("structured_outputs_config.backend",
                          cfg.get("backend"))
        except UnsupportedFeatureError:
            raise
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None

    def parallel_config(self) -> ParallelConfig:
        """The validated ParallelConfig (raises InvalidConfigError)."""
        from .distributed.parallel_config import parallel_config_from
        return parallel_config_from(self)

    def resolved_warmup(self, platform: str, pooling: bool = False) -> bool:
        """Whether to build every step program at start: as asked, else on
        GPUs (a user's first request compiles nothing) and not on CPU, nor
        for a pooling engine (which builds its programs on first use)."""
        if self.warmup is not None:
            return self.warmup
        return platform != "cpu" and not pooling

    def resolved_preemption(self) -> tuple[str, float]:
        """(preemption_mode, swap GiB): giving swap_space alone turns swap
        preemption on (its only use); swap alone gets vLLM's 4 GiB; the
        host pool exists only under swap."""
        mode = self.preemption_mode or ("swap" if self.swap_space else
                                        "recompute")
        if mode == "recompute":
            return mode, 0.0
        return mode, float(4.0 if self.swap_space is None else self.swap_space)

    def lora_config(self) -> LoRAConfig | None:
        """The LoRAConfig, or None without enable_lora (then the LoRA
        limits must keep vLLM's defaults: nothing would use them)."""
        from .lora.config import LoRAConfig
        if not self.enable_lora:
            changed = [f for f, default in (("max_loras", 1),
                                            ("max_lora_rank", 16),
                                            ("max_cpu_loras", None))
                       if getattr(self, f) != default]
            if changed:
                raise InvalidConfigError(
                    f"{', '.join(changed)} set without enable_lora: add "
                    "enable_lora=True (--enable-lora)")
            return None
        return LoRAConfig(self.max_loras, self.max_lora_rank,
                          self.max_cpu_loras)

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            enable_prefix_caching=self.enable_prefix_caching,
            swap_space=self.resolved_preemption()[1],
            cache_dtype=self.kv_cache_dtype)

    def scheduler_config(self, model_max_len: int, on_cpu: bool) -> SchedulerConfig:
        """``model_max_len``: the model's usable context
        (``derived_max_model_len``)."""
        max_len = self.max_model_len
        if max_len is None:
            # On CPU a long default only costs compile time and memory.
            max_len = min(model_max_len, 2048 if on_cpu else model_max_len)
        elif max_len > model_max_len:
            raise InvalidConfigError(
                f"max_model_len ({max_len}) is larger than the model's "
                f"context ({model_max_len}: max_position_embeddings times "
                "the RoPE scaling factor, if any): lower max_model_len")
        # Fewer seats on CPU: the KV pool is sized for every seat at full
        # length and zeroed at start, which a first run waits for.
        large = (not on_cpu and (self.max_num_seqs is None
                                 or self.max_num_batched_tokens is None)
                 and gpu_memory_bytes() >= LARGE_GPU_BYTES)
        max_seqs = self.max_num_seqs or (
            8 if on_cpu else LARGE_GPU_MAX_NUM_SEQS if large else 256)
        if self.max_num_seqs is None and self.max_num_batched_tokens:
            # The default seat count yields to an explicit token budget.
            max_seqs = min(max_seqs, self.max_num_batched_tokens)
        # GPU: vLLM's defaults for the usage context on a large GPU, 8192 on
        # others: wider mixed steps run the weights' matmuls closer to the
        # matmul rate (docs/performance.md, "Tokens per step"). CPU: 256, as
        # wider buckets cost compile time and memory.
        default_tokens = (
            256 if on_cpu else
            LARGE_GPU_MAX_NUM_BATCHED_TOKENS[self.usage_context] if large
            else 8192)
        max_tokens = self.max_num_batched_tokens or max(default_tokens,
                                                        max_seqs)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens is None:
            max_tokens = max(max_tokens, max_len)
        return SchedulerConfig(
            max_model_len=max_len, max_num_seqs=max_seqs,
            max_num_batched_tokens=max_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            preemption_mode=self.resolved_preemption()[0],
            num_scheduler_steps=self.num_scheduler_steps)


def check_kv_cache_dtype(name: str, value: str) -> None:
    """A vLLM kv_cache_dtype jaxinfer lacks (fp8_inc, fp8_ds_mla) is an
    UnsupportedFeatureError naming ``name``."""
    if value not in KV_CACHE_DTYPES:
        raise UnsupportedFeatureError(
            name, f"a {value!r} KV cache",
            f"use one of {', '.join(KV_CACHE_DTYPES)}")


def check_quantization(name: str, value: str) -> str:
    """vLLM's ``quantization`` value -> the method served; one jaxinfer
    lacks is an UnsupportedQuantizationError naming ``name`` (the flag or
    argument as the user spelled it)."""
    from jaxinfer.models.quantization import UnknownQuantizationError, normalize_method
    from jaxinfer.models.quantization.config import ALIASES, METHODS
    try:
        return normalize_method(value)
    except UnknownQuantizationError:
        raise UnsupportedQuantizationError(
            name, f"quantization {value!r}",
            f"it serves {', '.join(METHODS + tuple(ALIASES))}, or leave it "
            "unset (a checkpoint's own quantization_config is used)") from None


# RoPE types whose config states the trained length, which the scaling
# factor stretches (vLLM's rule); llama3 configs already state the extended
# length in max_position_embeddings.
_STRETCHING_ROPE_TYPES = ("default", "linear", "dynamic", "yarn")


def derived_max_model_len(model_config: ModelConfig) -> int:
    """The longest context the model serves: ``max_position_embeddings``
    times the RoPE scaling factor (yarn: ``original_max_position_embeddings``
    times it), as vLLM derives it."""
    rope = model_config.rope_scaling
    length = model_config.max_position_embeddings
    if rope.rope_type not in _STRETCHING_ROPE_TYPES:
        return length
    if rope.rope_type == "yarn" and rope.original_max_position_embeddings:
        length = rope.original_max_position_embeddings
    return int(length * rope.factor)
