"""/metrics parses with prometheus_client and counts exactly what was sent;
a client that vanishes (streaming or not) aborts its request and frees its
pages at once."""

from __future__ import annotations

import time

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .conftest import engine_state, pages_all_free, start_server

# The in-process and the multi-process server (conftest.py).
pytestmark = pytest.mark.both_servers


@pytest.fixture(scope="module")
def served(tiny_model_factory, server_mode):
    server, engine = start_server(tiny_model_factory(), served_model_names=["tiny"],
                                  mode=server_mode,
                                  max_model_len=512, num_gpu_blocks_override=256,
                                  max_num_seqs=8, max_num_batched_tokens=128)
    yield server, engine
    server.stop()


def scrape(base_url: str) -> dict[tuple, float]:
    """{(sample name, frozen labels without model_name): value}."""
    text = requests.get(base_url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def delta(before, after, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_counters_equal_what_was_sent(served):
    server, _ = served
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x",
                           max_retries=0)
    before = scrape(server.base_url)
    usages = []
    for prompt, n in [("one two three", 5), ("a longer prompt than that one", 7),
                      ("x", 3)]:
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
        usages.append(r.usage)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    usages.append(chunks[-1].usage)
    after = scrape(server.base_url)

    p = "jaxinfer:"
    assert delta(before, after, p + "prompt_tokens_total") == \
        sum(u.prompt_tokens for u in usages)
    assert delta(before, after, p + "generation_tokens_total") == \
        sum(u.completion_tokens for u in usages) == 5 + 7 + 3 + 4
    assert delta(before, after, p + "request_success_total",
                 finished_reason="length") == 4
    assert delta(before, after, p + "request_success_total",
                 finished_reason="abort") == 0
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds"):
        assert delta(before, after, p + hist + "_count") == 4, hist
    # one inter-token gap per token after the first
    assert delta(before, after, p + "inter_token_latency_seconds_count") == \
        sum(u.completion_tokens - 1 for u in usages)
    assert after[(p + "num_requests_running", ())] == 0
    assert after[(p + "kv_cache_usage_perc", ())] == 0
    assert (p + "prefix_cache_queries_total", ()) in after
    assert (p + "num_preemptions_total", ()) in after


def _wait_for_abort(base_url, before, timeout=20.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = delta(before, scrape(base_url), "jaxinfer:request_success_total",
                  finished_reason="abort")
        if d:
            return d
        time.sleep(0.05)
    return 0.0


def test_streaming_disconnect_aborts_and_frees_pages(served):
    server, engine = served
    before = scrape(server.base_url)
    r = requests.post(server.base_url + "/v1/chat/completions", stream=True,
                      timeout=60, json={
                          "model": "tiny", "stream": True, "max_tokens": 480,
                          "ignore_eos": True,
                          "messages": [{"role": "user", "content": "go on"}]})
    lines = r.iter_lines()
    got = 0
    while got < 4:  # role chunk + a few tokens: the request is running
        if next(lines):
            got += 1
    state = engine_state(engine)
    assert state["free_pages"] < state["pages"] - 1 and state["tracked"] == 1
    r.close()  # the client hangs up mid-stream
    assert _wait_for_abort(server.base_url, before) == 1
    assert pages_all_free(engine)  # no output state left either
    after = scrape(server.base_url)
    assert after[("jaxinfer:num_requests_running", ())] == 0
    # The abort came early: nowhere near the 480 tokens asked for.
    assert delta(before, after, "jaxinfer:generation_tokens_total") < 400


def test_non_streaming_disconnect_aborts_and_frees_pages(served):
    server, engine = served
    before = scrape(server.base_url)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(server.base_url + "/v1/completions", timeout=(5, 0.5), json={
            "model": "tiny", "prompt": "count", "max_tokens": 500,
            "ignore_eos": True})
    assert _wait_for_abort(server.base_url, before) == 1
    assert pages_all_free(engine)  # no output state left either
    after = scrape(server.base_url)
    assert delta(before, after, "jaxinfer:generation_tokens_total") < 450
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200


def test_vllm_names_and_families(served):
    """vLLM's names (vllm:, labels model_name + engine) mirror jaxinfer's,
    and vLLM's per-request families count each request."""
    server, _ = served
    before = scrape(server.base_url)
    for prompt, n in [("one two three", 3), ("four", 2)]:
        r = requests.post(server.base_url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": prompt, "max_tokens": n,
            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200
    text = requests.get(server.base_url + "/metrics", timeout=10).text
    after = scrape(server.base_url)
    ours = {k: v for k, v in after.items() if k[0].startswith("jaxinfer:")}
    for (name, labels), value in ours.items():
        twin = ("vllm:" + name[len("jaxinfer:"):],
                tuple(sorted(labels + (("engine", "0"),))))
        if not name.endswith("_created"):
            assert after[twin] == value, twin
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"}' in text
    v = "vllm:"
    assert delta(before, after, v + "request_prompt_tokens_count",
                 engine="0") == 2
    assert delta(before, after, v + "request_generation_tokens_sum",
                 engine="0") == 3 + 2
    for hist in ("request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "request_params_n"):
        assert delta(before, after, v + hist + "_count", engine="0") == 2, hist
    # every step is one observation, of the tokens it scheduled
    assert delta(before, after, v + "iteration_tokens_total_count", engine="0") >= 3
    assert delta(before, after, v + "iteration_tokens_total_sum", engine="0") >= \
        delta(before, after, v + "request_prompt_tokens_sum", engine="0")
    info = [k for k in after if k[0] == "vllm:cache_config_info"]
    assert info and ("num_gpu_blocks", "256") in info[0][1]


def test_step_program_count_and_compiles_are_metrics(served):
    """/metrics reports the step programs against the set enumerated at
    start, and the compiles behind them."""
    server, _ = served
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x",
                           max_retries=0)
    client.completions.create(model="tiny", prompt="hi", max_tokens=2,
                              logprobs=2, extra_body={"min_tokens": 1})
    m = scrape(server.base_url)
    known = m[("jaxinfer:step_programs_known", ())]
    assert known > 0
    assert 0 < m[("jaxinfer:step_programs", ())] <= known
    assert m[("jaxinfer:compiles_total", ())] > 0
    assert m[("jaxinfer:compile_seconds_total", ())] > 0
    assert m[("vllm:step_programs", (("engine", "0"),))] == \
        m[("jaxinfer:step_programs", ())]
