"""Prometheus metrics with vLLM's meanings under a ``jaxinfer:`` prefix,
and the same families again under vLLM's names and labels (``vllm:``,
labels ``model_name`` and ``engine``), so dashboards and alerts written
for vLLM read a jaxinfer server unchanged.

Each server owns its own ``CollectorRegistry`` (two engines in one process, as
in tests, never share counters). Everything is written from the engine thread,
which sees every step's outputs; prometheus_client is thread-safe, so the
``/metrics`` handler reads the registry while the loop runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric

if TYPE_CHECKING:
    from .config import CacheConfig
    from .engine.llm_engine import EngineStats
    from .outputs import RequestOutput
    from .sampling_params import SamplingParams
    from .spec_decode.stats import SpecDecodeStats

PREFIX = "jaxinfer:"
VLLM_PREFIX = "vllm:"
VLLM_ENGINE_LABEL = "0"  # vLLM labels each engine core; jaxinfer has one
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                           8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10

# vLLM's bucket choices (seconds), so dashboards built for vLLM read the same.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                   7680.0]
FINISHED_REASONS = ("stop", "length", "abort")


class EngineMetrics:
    """The metric families of one engine, labelled with its model name."""

    def __init__(self, model_name: str = "",
                 registry: CollectorRegistry | None = None,
                 max_model_len: int = 8192):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.vllm_registry = CollectorRegistry()
        self.vllm_registry.register(VllmNames(self.registry))
        r, lab = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, lab, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, lab, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: list[int] | list[float]
                      ) -> Histogram:
            return Histogram(PREFIX + name, doc, lab, buckets=buckets,
                             registry=r).labels(model_name)

        self.num_requests_running = gauge(
            "num_requests_running", "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge(
            "num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage_perc = gauge(
            "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = counter(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.")
        self.num_preemptions = counter(
            "num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prompt_tokens = counter(
            "prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "generation_tokens", "Number of generation tokens processed.")
        success = Counter(PREFIX + "request_success",
                          "Count of finished requests, by finish reason.",
                          ["model_name", "finished_reason"], registry=r)
        self.request_success = {reason: success.labels(model_name, reason)
                                for reason in FINISHED_REASONS}
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        # vLLM's older names, which its example dashboard and many alerts
        # still query: the same observations under both.
        self.time_per_output_token = histogram(
            "time_per_output_token_seconds",
            "Histogram of time per output token in seconds (the older name "
            "of inter_token_latency_seconds).", ITL_BUCKETS)
        self.gpu_cache_usage_perc = gauge(
            "gpu_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage (the older name of "
            "kv_cache_usage_perc).")
        self.num_requests_swapped = gauge(
            "num_requests_swapped",
            "Number of requests whose KV pages are swapped to host memory.")
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS)
        self.request_queue_time = histogram(
            "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_BUCKETS)
        tokens = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens",
            "Number of prefill tokens processed.", tokens)
        self.request_generation_tokens = histogram(
            "request_generation_tokens",
            "Number of generation tokens processed.", tokens)
        self.request_max_num_generation_tokens = histogram(
            "request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens)
        self.request_params_n = histogram(
            "request_params_n", "Histogram of the n request parameter.",
            PARAMS_N_BUCKETS)
        self.request_params_max_tokens = histogram(
            "request_params_max_tokens",
            "Histogram of the max_tokens request parameter.", tokens)
        self.iteration_tokens = histogram(
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS)
        self.request_inference_time = histogram(
            "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_BUCKETS)
        self.request_prefill_time = histogram(
            "request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS)
        self.request_decode_time = histogram(
            "request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_BUCKETS)
        # The step programs: how many exist against the set known at start,
        # and the compiles behind them (none after warm-up).
        self.step_programs = gauge(
            "step_programs", "Compiled step programs built or run so far.")
        self.step_programs_known = gauge(
            "step_programs_known",
            "Step programs a step can run (the set enumerated at start).")
        self.compiles = counter(
            "compiles", "XLA compiles and compilation-cache loads since start.")
        self.compile_seconds = counter(
            "compile_seconds", "Seconds spent compiling since start.")
        # Speculative decoding (vLLM's spec_decode_* counters).
        self.spec_decode_num_drafts = counter(
            "spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_decode_num_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_decode_num_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self._accepted_per_pos = Counter(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.", ["model_name", "position"],
            registry=r)
        self._model_name = model_name
        self._cache_info = Gauge(
            PREFIX + "cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "gpu_memory_utilization",
             "enable_prefix_caching", "swap_space", "cache_dtype"], registry=r)
        # Engine counters arrive as running totals; these hold the last seen.
        self._last_totals: dict[str, float] = {}

    def record_cache_config(self, cache_config: CacheConfig, num_gpu_blocks: int,
                            cache_dtype: str) -> None:
        """vLLM's info metric: a gauge set to 1 whose labels are the cache
        configuration."""
        self._cache_info.labels(
            str(cache_config.block_size), str(num_gpu_blocks),
            str(cache_config.gpu_memory_utilization),
            str(cache_config.enable_prefix_caching),
            str(cache_config.swap_space), cache_dtype).set(1)

    def record_request_params(self, params: SamplingParams) -> None:
        """At admission: the request's n and max_tokens."""
        self.request_params_n.observe(params.n)
        if params.max_tokens is not None:
            self.request_params_max_tokens.observe(params.max_tokens)
            self.request_max_num_generation_tokens.observe(params.max_tokens)

    def record_iteration(self, num_tokens: int) -> None:
        """One engine step that scheduled ``num_tokens`` tokens."""
        if num_tokens:
            self.iteration_tokens.observe(num_tokens)

    def record_request_done(self, out: RequestOutput, now: float,
                            num_generated: int) -> None:
        """A finished request (its last RequestOutput and the tokens it
        generated): token counts and its phase times (prefill: scheduled to
        first token; decode: first token to the end; inference: both)."""
        self.request_prompt_tokens.observe(len(out.prompt_token_ids))
        self.request_generation_tokens.observe(num_generated)
        m = out.metrics
        if m is None or m.first_scheduled_time is None:
            return
        first = m.first_token_time or now
        self.request_prefill_time.observe(max(0.0, first - m.first_scheduled_time))
        self.request_decode_time.observe(max(0.0, now - first))
        self.request_inference_time.observe(max(0.0, now - m.first_scheduled_time))

    def record_finished(self, reason: str | None) -> None:
        self.request_success.get(reason or "stop",
                                 self.request_success["stop"]).inc()

    def record_engine_stats(self, stats: EngineStats) -> None:
        """Copies an ``EngineStats`` into the gauges and advances counters by
        the growth of the engine's running totals. Fields the engine does not
        report yet are skipped."""
        steps = getattr(stats, "num_steps", 0)
        if steps > self._last_totals.get("num_steps", 0):
            self.record_iteration(stats.last_step_tokens)
        self._last_totals["num_steps"] = steps
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.num_requests_swapped.set(getattr(stats, "num_swapped", 0))
        self.kv_cache_usage_perc.set(stats.kv_cache_usage)
        self.gpu_cache_usage_perc.set(stats.kv_cache_usage)
        self.step_programs.set(getattr(stats, "num_step_programs", 0))
        self.step_programs_known.set(
            getattr(stats, "num_known_step_programs", 0))
        for field, metric in (("num_compiles", self.compiles),
                              ("compile_seconds", self.compile_seconds),
                              ("num_preemptions", self.num_preemptions),
                              ("prefix_cache_queries", self.prefix_cache_queries),
                              ("prefix_cache_hits", self.prefix_cache_hits)):
            total = getattr(stats, field, None)
            if total is None:
                continue
            grown = total - self._last_totals.get(field, 0)
            if grown > 0:
                metric.inc(grown)
            self._last_totals[field] = total
        spec = getattr(stats, "spec_decode", None)
        if spec is not None:
            self._record_spec_decode(spec)

    def _record_spec_decode(self, spec: SpecDecodeStats) -> None:
        """Advances the spec_decode_* counters to a SpecDecodeStats' totals."""
        totals = [("spec_num_drafts", spec.num_drafts, self.spec_decode_num_drafts),
                  ("spec_num_draft_tokens", spec.num_draft_tokens,
                   self.spec_decode_num_draft_tokens),
                  ("spec_num_accepted", spec.num_accepted_tokens,
                   self.spec_decode_num_accepted_tokens)]
        for pos, n in enumerate(spec.accepted_per_pos):
            totals.append((f"spec_pos_{pos}", n, self._accepted_per_pos.labels(
                self._model_name, str(pos))))
        for key, total, metric in totals:
            grown = total - self._last_totals.get(key, 0)
            if grown > 0:
                metric.inc(grown)
            self._last_totals[key] = total

    def render(self) -> bytes:
        """jaxinfer's families, then the same under vLLM's names."""
        return generate_latest(self.registry) + generate_latest(self.vllm_registry)


class VllmNames:
    """A collector that re-exports every ``jaxinfer:`` family of a registry
    under ``vllm:`` with vLLM's label set (``engine`` added), read at scrape
    time: one source of truth, two spellings."""

    def __init__(self, source: CollectorRegistry):
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            if not family.name.startswith(PREFIX):
                continue
            name = VLLM_PREFIX + family.name[len(PREFIX):]
            alias = Metric(name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                alias.add_sample(
                    VLLM_PREFIX + sample.name[len(PREFIX):],
                    {**sample.labels, "engine": VLLM_ENGINE_LABEL},
                    sample.value, sample.timestamp, sample.exemplar)
            yield alias

    def describe(self) -> list[Metric]:
        return []  # names are known only at scrape time
