"""vLLM's `vllm serve` flags and `EngineArgs` fields that jaxinfer does not
implement, keyed by their argparse dest (which is also the EngineArgs field
name): each is ignored with the reason that makes that harmless, or refused
naming the missing feature. ``surface.py`` checks that every vLLM name is
either supported by the code or listed here."""

from __future__ import annotations

from .status import Status, ignore, refuse

MM = "multimodal inputs other than images (audio, video)"
IMAGES_HINT = ("send images inline as base64 data URLs, or as file:// URLs "
               "under --allowed-local-media-path")
LORA = "LoRA adapters"
LORA_BIAS = "LoRA adapters with bias terms"
STRUCTURED = "structured output (guided decoding)"
SPEC = "speculative decoding"
POOLING = "pooling settings other than the model's sentence-transformers files"
POOLING_HINT = ("write modules.json and 1_Pooling/config.json into the model "
                "folder; PoolingParams.normalize / dimensions per request")
MOE = "mixture-of-experts parallelism"
HUB = "loading from a model hub"
HUB_HINT = ("jaxinfer never downloads: fetch the revision yourself and pass "
            "its local folder as the model")
TLS_HINT = "terminate TLS in a reverse proxy in front of jaxinfer"
ONE = (None, 1)  # vLLM's default of 1 means "off"
DP_RANKS = "data-parallel ranks in separate engine processes"
DP_HINT = ("--data-parallel-size N runs N replicas behind one front in one "
           "process; across hosts, run a server per replica behind a load "
           "balancer")

ENGINE_FLAGS: dict[str, Status] = {
    # -- model and tokenizer ------------------------------------------------
    "tokenizer_mode": refuse("slow or mistral tokenizers",
                             "the fast (HF tokenizers) tokenizer is used",
                             (None, "auto", "hf")),
    "trust_remote_code": ignore(
        "jaxinfer runs its own implementation of each supported "
        "architecture and never executes code shipped with a model"),
    "hf_config_path": refuse("a config.json apart from the model",
                             "put config.json in the model folder"),
    "allowed_media_domains": refuse(
        "fetching remote media", "jaxinfer downloads nothing at run time; "
        + IMAGES_HINT, accepts=(None, "", "[]", [])),
    "revision": refuse(HUB, HUB_HINT),
    "code_revision": refuse(HUB, HUB_HINT),
    "tokenizer_revision": refuse(HUB, HUB_HINT),
    "download_dir": refuse(HUB, HUB_HINT),
    "hf_token": ignore("jaxinfer never contacts a model hub, so no token "
                       "is ever sent"),
    "rope_scaling": refuse("overriding the model's RoPE scaling",
                           "edit rope_scaling in the model's config.json",
                           (None, "{}", {})),
    "rope_theta": refuse("overriding the model's RoPE theta",
                         "edit rope_theta in the model's config.json"),
    "hf_overrides": refuse("overriding config.json fields",
                           "edit the model's config.json", (None, "{}", {})),
    "enforce_eager": ignore(
        "there are no CUDA graphs to turn off: every step is one compiled "
        "XLA program, eager or not"),
    "logprobs_mode": refuse("logprobs of processed logits",
                            "logprobs are always of the raw logits",
                            (None, "raw_logprobs")),
    "disable_sliding_window": refuse(
        "turning a model's sliding window off",
        "models with a window always attend within it"),
    "disable_cascade_attn": ignore("jaxinfer has no cascade attention to "
                                   "turn off"),
    "skip_tokenizer_init": refuse("serving without a tokenizer",
                                  "the engine needs the model's tokenizer"),
    "enable_prompt_embeds": refuse("prompt embeddings as input"),
    "served_model_name": ignore(
        "an offline engine reports no model name; `jaxinfer serve "
        "--served-model-name` sets the API's"),
    "config_format": refuse("mistral-format configs", "use an HF config.json",
                            (None, "auto", "hf")),
    "pooler_config": refuse(POOLING, POOLING_HINT),
    "override_pooler_config": refuse(POOLING, POOLING_HINT),
    "logits_processor_pattern": refuse("per-request logits processors"),
    "generation_config": refuse(
        "defaults read from generation_config.json",
        "requests use vLLM's own defaults; pass sampling values per request",
        (None, "vllm")),
    "override_generation_config": refuse(
        "default sampling overrides", "pass sampling values per request",
        (None, "{}", {})),
    "enable_sleep_mode": refuse("sleep mode (releasing device memory)"),
    "model_impl": refuse("other model implementations",
                         "jaxinfer's own Flax models are used",
                         (None, "auto")),
    "override_attention_dtype": refuse("a separate attention dtype",
                                       "attention runs in --dtype"),
    "logits_processors": refuse("custom logits processors"),
    "io_processor_plugin": refuse("IO processor plugins"),
    # -- loading ------------------------------------------------------------
    "safetensors_load_strategy": ignore(
        "safetensors are always read tensor by tensor straight into their "
        "sharding; the strategy changes nothing but load speed"),
    "model_loader_extra_config": refuse("loader plugins", accepts=(None, "{}", {})),
    "ignore_patterns": ignore("it filters hub downloads, and jaxinfer never "
                              "downloads"),
    "use_tqdm_on_load": ignore("it only switches a progress bar"),
    "pt_load_map_location": refuse(".pt checkpoints", "convert to safetensors",
                                   (None, "cpu")),
    "reasoning_parser": refuse("reasoning output parsing", accepts=(None, "")),
    "guided_decoding_disable_fallback": ignore(
        "there is one grammar library, so nothing to fall back to"),
    "guided_decoding_disable_any_whitespace": refuse(
        "engine-wide structured-output defaults",
        "set disable_any_whitespace per request in structured_outputs"),
    "guided_decoding_disable_additional_properties": refuse(
        "engine-wide structured-output defaults",
        "set disable_additional_properties per request in "
        "structured_outputs"),
    # -- parallelism --------------------------------------------------------
    "decode_context_parallel_size": refuse("decode context parallelism",
                                           accepts=ONE),
    "data_parallel_rank": refuse(DP_RANKS, DP_HINT),
    "data_parallel_start_rank": refuse(DP_RANKS, DP_HINT),
    "data_parallel_size_local": refuse(DP_RANKS, DP_HINT),
    "data_parallel_address": refuse(DP_RANKS, DP_HINT),
    "data_parallel_rpc_port": refuse(DP_RANKS, DP_HINT),
    "data_parallel_backend": refuse(
        "data-parallel replicas placed by Ray",
        "--data-parallel-size runs the replicas in one process over its "
        "devices", (None, "mp")),
    "data_parallel_hybrid_lb": refuse(DP_RANKS, DP_HINT),
    "headless": refuse(
        "headless (engine-only) data-parallel ranks",
        "a multi-process engine's processes other than 0 serve no HTTP: "
        "start them with --process-id N"),
    "enable_expert_parallel": refuse(MOE),
    "enable_dbo": refuse("dual-batch overlap"),
    "dbo_decode_token_threshold": refuse("dual-batch overlap", accepts=(None, 32)),
    "dbo_prefill_token_threshold": refuse("dual-batch overlap", accepts=(None, 512)),
    "enable_eplb": refuse(MOE),
    "eplb_config": refuse(MOE),
    "expert_placement_strategy": refuse(MOE, accepts=(None, "linear")),
    "num_redundant_experts": refuse(MOE),
    "eplb_window_size": refuse(MOE),
    "eplb_step_interval": refuse(MOE),
    "eplb_log_balancedness": refuse(MOE),
    "max_parallel_loading_workers": ignore(
        "each process loads its own devices' shards; the count changes "
        "nothing but load speed"),
    "ray_workers_use_nsight": refuse("Nsight profiling of Ray workers"),
    "disable_custom_all_reduce": ignore(
        "collectives are XLA's own; there is no custom all-reduce to turn off"),
    "worker_cls": refuse("custom worker classes", accepts=(None, "auto")),
    "worker_extension_cls": refuse("worker extensions", accepts=(None, "")),
    "enable_multimodal_encoder_data_parallel": refuse(
        "a data-parallel vision encoder",
        "the encoder is split like the model (--tensor-parallel-size)"),
    # -- KV cache -----------------------------------------------------------
    "kv_cache_memory_bytes": refuse(
        "sizing the KV cache in bytes", "use --num-gpu-blocks-override "
        "(pages) or --gpu-memory-utilization"),
    "prefix_caching_hash_algo": ignore(
        "the hash only keys jaxinfer's own prefix cache in one process; any "
        "algorithm gives the same hits"),
    "cpu_offload_gb": refuse("offloading weights to host memory", accepts=(None, 0)),
    "calculate_kv_scales": ignore(
        "fp8 KV pages always get scales computed from their own tokens "
        "(one per kv head and page, kept as the page fills)"),
    "kv_sharing_fast_prefill": refuse("cross-layer KV sharing"),
    "mamba_cache_dtype": refuse("Mamba models", accepts=(None, "auto")),
    "mamba_ssm_cache_dtype": refuse("Mamba models", accepts=(None, "auto")),
    # -- multimodal ---------------------------------------------------------
    "media_io_kwargs": refuse("media decoding options",
                              accepts=(None, "{}", {})),
    "mm_processor_kwargs": refuse(
        "image processor overrides", "edit the model's "
        "preprocessor_config.json", accepts=(None, "{}", {})),
    "mm_processor_cache_gb": ignore(
        "jaxinfer keeps no cache of preprocessed images between requests "
        "(a repeated image reuses its KV pages through the prefix cache); "
        "its size changes nothing"),
    "disable_mm_preprocessor_cache": ignore(
        "jaxinfer keeps no preprocessed-image cache to turn off"),
    "mm_processor_cache_type": refuse("a shared-memory image cache",
                                      accepts=(None, "lru")),
    "mm_shm_cache_max_object_size_mb": refuse("a shared-memory image cache",
                                              accepts=(None, 128)),
    "mm_encoder_tp_mode": refuse(
        "a data-parallel vision encoder (mm_encoder_tp_mode=data)",
        "the encoder's weights are split like the model's",
        (None, "weights")),
    "interleave_mm_strings": refuse(
        "image placeholders interleaved in string content",
        "each image's placeholder goes before its message's text, as "
        "vLLM's default"),
    "skip_mm_profiling": ignore(
        "jaxinfer runs no encoder profiling at start: the encoder cache is "
        "sized from max_num_batched_tokens"),
    "video_pruning_rate": refuse("video inputs"),
    "disable_chunked_mm_input": refuse(
        "keeping an image's tokens in one step",
        "an image's placeholders may be split over steps; its encoder "
        "output stays cached until the last"),
    # -- LoRA (enable_lora, max_loras, max_lora_rank, max_cpu_loras are
    # supported) ---------------------------------------------------------
    "enable_lora_bias": refuse(LORA_BIAS, "use adapters trained with "
                               "bias='none'"),
    "lora_extra_vocab_size": refuse(
        "LoRA adapters that add vocabulary (deprecated in vLLM)",
        accepts=(None, 256)),
    "lora_dtype": refuse("a LoRA dtype other than the model's",
                         "adapters run in --dtype", (None, "auto")),
    "fully_sharded_loras": ignore(
        "adapters are split like the base layers they change (column- or "
        "row-parallel), which gives the same results as vLLM's fully "
        "sharded layout; only speed differs"),
    "default_mm_loras": refuse("LoRA adapters chosen per input modality"),
    # -- observability ------------------------------------------------------
    "show_hidden_metrics_for_version": refuse("hidden (deprecated) metrics"),
    "otlp_traces_endpoint": refuse("OpenTelemetry tracing",
                                   "use the Prometheus /metrics"),
    "collect_detailed_traces": refuse("OpenTelemetry tracing"),
    "disable_log_stats": ignore("jaxinfer logs no periodic stats; /metrics "
                                "is unaffected, as in vLLM"),
    "enable_log_requests": refuse("logging each request",
                                  "read /metrics or put a logging proxy in "
                                  "front"),
    "disable_log_requests": ignore("jaxinfer does not log requests"),
    # -- scheduler ----------------------------------------------------------
    "max_num_partial_prefills": refuse("concurrent partial prefills",
                                       accepts=ONE),
    "max_long_partial_prefills": refuse("concurrent partial prefills",
                                        accepts=ONE),
    "long_prefill_token_threshold": refuse("concurrent partial prefills",
                                           accepts=(None, 0)),
    "cuda_graph_sizes": ignore("there are no CUDA graphs; jaxinfer compiles "
                               "its own shape buckets"),
    "num_lookahead_slots": refuse(SPEC, accepts=(None, 0)),
    "scheduler_cls": refuse("custom scheduler classes",
                            accepts=(None, "vllm.core.scheduler.Scheduler")),
    "disable_hybrid_kv_cache_manager": ignore(
        "every layer shares one KV page pool; there is no hybrid manager "
        "to turn off"),
    "kv_transfer_config": refuse("KV transfer (disaggregated prefill)"),
    "kv_events_config": refuse("KV cache events"),
    "compilation_config": refuse("vLLM's torch.compile settings",
                                 "XLA compiles every step; see "
                                 "--compilation-cache-dir",
                                 (None, "{}", {})),
    "additional_config": refuse("platform plugin settings",
                                accepts=(None, "{}", {})),
}

# vLLM engine arguments that `jaxinfer serve` implements as flags of its
# own although an offline engine has no use for them (entries above say
# what LLM(...) does with them).
SERVE_IMPLEMENTS = frozenset({"served_model_name"})

# `vllm serve` flags of the HTTP front end (not EngineArgs fields).
SERVE_FLAGS: dict[str, Status] = {
    "config": refuse("YAML config files", "pass the flags on the command line"),
    "uds": refuse("Unix domain sockets", "use --host and --port"),
    "disable_uvicorn_access_log": ignore(
        "only changes uvicorn's access log lines"),
    "allow_credentials": refuse("CORS settings",
                                "put a reverse proxy in front to add CORS"),
    "allowed_origins": refuse("CORS settings",
                              "put a reverse proxy in front to add CORS",
                              (None, "['*']", "*")),
    "allowed_methods": refuse("CORS settings",
                              "put a reverse proxy in front to add CORS",
                              (None, "['*']", "*")),
    "allowed_headers": refuse("CORS settings",
                              "put a reverse proxy in front to add CORS",
                              (None, "['*']", "*")),

    "trust_request_chat_template": refuse("chat templates sent in requests"),
    "response_role": refuse("another response role",
                            "replies carry role 'assistant'",
                            (None, "assistant")),
    "ssl_keyfile": refuse("TLS", TLS_HINT),
    "ssl_certfile": refuse("TLS", TLS_HINT),
    "ssl_ca_certs": refuse("TLS", TLS_HINT),
    "enable_ssl_refresh": refuse("TLS", TLS_HINT),
    "ssl_cert_reqs": refuse("TLS", TLS_HINT, (None, 0)),
    "root_path": refuse("a root path behind a proxy",
                        "strip the prefix in the proxy"),
    "middleware": refuse("custom ASGI middleware", accepts=(None, "[]", [])),
    "disable_frontend_multiprocessing": ignore(
        "the server and the engine always share one process"),
    "enable_request_id_headers": refuse("X-Request-Id response headers"),
    "tool_parser_plugin": refuse(
        "tool parser plugins (Python files loaded at start)",
        "pick a built-in format with --tool-call-parser", accepts=(None, "")),
    "tool_server": refuse(
        "built-in tool servers (MCP / demo tools run by the server)",
        "run the tools in the client and send their results as tool "
        "messages"),
    "log_config_file": refuse("a logging config file"),
    "max_log_len": ignore("jaxinfer does not log prompts"),
    "disable_fastapi_docs": refuse("turning the /docs pages off"),
    "enable_prompt_tokens_details": refuse("usage.prompt_tokens_details"),
    "enable_force_include_usage": refuse("usage forced into every response"),
    "enable_log_outputs": refuse("logging each output"),
    "h11_max_incomplete_event_size": ignore(
        "uvicorn's own h11 limits apply; they only bound header sizes"),
    "h11_max_header_count": ignore(
        "uvicorn's own h11 limits apply; they only bound header counts"),
    "log_error_stack": ignore("errors are logged with their stack anyway"),
}
