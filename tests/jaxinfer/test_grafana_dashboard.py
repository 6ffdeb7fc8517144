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
