"""examples/grafana_dashboard.json queries only metrics the server exports."""

from __future__ import annotations

import json
import pathlib
import re

from prometheus_client.parser import text_string_to_metric_families

from jaxinfer.config import CacheConfig
from jaxinfer.metrics import EngineMetrics

DASHBOARD = pathlib.Path(__file__).parents[2] / "examples" / "grafana_dashboard.json"


def exported_sample_names() -> set[str]:
    m = EngineMetrics("m")
    m.record_cache_config(CacheConfig(), 10, "float32")
    for hist in (m.time_to_first_token, m.iteration_tokens):
        hist.observe(1.0)
    text = m.render().decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_dashboard_queries_exported_metrics():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"jaxinfer:[a-z0-9_]+", e)}
    assert len(used) >= 10
    missing = used - exported_sample_names()
    assert not missing, f"the dashboard queries metrics nobody exports: {missing}"
    for name in used:  # and vLLM's spelling of each exists too
        assert "vllm:" + name[len("jaxinfer:"):] in exported_sample_names()


# The metric names vLLM's example Grafana dashboard
# (examples/online_serving/prometheus_grafana/grafana.json) queries.
VLLM_DASHBOARD_NAMES = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
    "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_bucket",
    "vllm:num_requests_swapped", "vllm:kv_cache_usage_perc",
]


def test_vllm_dashboard_metric_names_are_exported():
    m = EngineMetrics("m")
    for hist in (m.time_per_output_token, m.request_prompt_tokens,
                 m.request_generation_tokens, m.request_max_num_generation_tokens,
                 m.e2e_request_latency, m.time_to_first_token,
                 m.request_queue_time, m.request_prefill_time,
                 m.request_decode_time):
        hist.observe(1.0)
    text = m.render().decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert not set(VLLM_DASHBOARD_NAMES) - names
