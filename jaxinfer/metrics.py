"""Prometheus metrics with vLLM's meanings under a ``jaxinfer:`` prefix.

Each server owns its own ``CollectorRegistry`` (two engines in one process, as
in tests, never share counters). Everything is written from the engine thread,
which sees every step's outputs; prometheus_client is thread-safe, so the
``/metrics`` handler reads the registry while the loop runs.
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

PREFIX = "jaxinfer:"

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
                 registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r, lab = self.registry, ["model_name"]

        def gauge(name, doc):
            return Gauge(PREFIX + name, doc, lab, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(PREFIX + name, doc, lab, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
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
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS)
        self.request_queue_time = histogram(
            "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_BUCKETS)
        # Engine counters arrive as running totals; these hold the last seen.
        self._last_totals: dict[str, int] = {}

    def record_finished(self, reason: str | None) -> None:
        self.request_success.get(reason or "stop",
                                 self.request_success["stop"]).inc()

    def record_engine_stats(self, stats) -> None:
        """Copies an ``EngineStats`` into the gauges and advances counters by
        the growth of the engine's running totals. Fields the engine does not
        report yet are skipped."""
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.kv_cache_usage_perc.set(stats.kv_cache_usage)
        for field, metric in (("num_preemptions", self.num_preemptions),
                              ("prefix_cache_queries", self.prefix_cache_queries),
                              ("prefix_cache_hits", self.prefix_cache_hits)):
            total = getattr(stats, field, None)
            if total is None:
                continue
            grown = total - self._last_totals.get(field, 0)
            if grown > 0:
                metric.inc(grown)
            self._last_totals[field] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)
