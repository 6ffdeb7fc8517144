"""Fuzzing every endpoint of the servers over one tiny engine:
hypothesis bodies (valid, near-valid, hostile) to each POST route, and
schemathesis from the server's own /openapi.json with every check. Together
at least 2,000 requests; none may get a 5xx (nor a 5xx error event inside a
stream), the engine loop never dies, /health answers 200 throughout, and a
greedy request gives the same output before and after."""

from __future__ import annotations

import collections
import json
import threading
import time

import pytest
import requests

from .conftest import pages_all_free, serve_app, start_server
from .fuzz_strategies import ENDPOINTS, request_bodies

# One worker runs both (`--dist loadgroup`): they share the server and its
# request count, which the module's teardown checks against the budget.
# The HTTP front end fuzzed here is the same code in both server modes, so
# the suite fuzzes the in-process one; JAXINFER_TEST_SERVER=split fuzzes
# the multi-process one (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fuzz")]

EXAMPLES_PER_ROUTE = 180  # hypothesis bodies per POST route (5 routes)
SCHEMATHESIS_EXAMPLES = 150  # per operation and generation mode
GREEDY = {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 6,
          "temperature": 0}


class HealthWatch:
    """Polls /health from a thread; records every answer that is not 200."""

    def __init__(self, url: str):
        self.url, self.bad, self.polls = url, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        session = requests.Session()
        while not self.stop.wait(0.05):
            try:
                status = session.get(self.url, timeout=10).status_code
            except requests.RequestException as e:
                status = repr(e)
            self.polls += 1
            if status != 200:
                self.bad.append(status)

    def close(self):
        self.stop.set()
        self.thread.join(15)


@pytest.fixture(scope="module")
def fuzzed(tiny_model_factory, server_mode):
    from jaxinfer.entrypoints.api_server import build_app
    # A short context keeps every generated request quick: longer asks are 400s.
    server, engine = start_server(tiny_model_factory(), served_model_names=["tiny"],
                                  mode=server_mode, max_model_len=96, num_gpu_blocks_override=128,
                                  max_num_seqs=4, max_num_batched_tokens=64)
    generate = serve_app(engine, build_app)
    # In-process: the same loop thread serves throughout (none restarted).
    engine_thread = getattr(engine, "_thread", None)
    greedy = requests.post(server.base_url + "/v1/completions", json=GREEDY,
                           timeout=60).json()["choices"][0]["text"]
    watch = HealthWatch(server.base_url + "/health")
    sent: collections.Counter = collections.Counter()  # requests per fuzzer
    yield server, generate, engine, sent
    watch.close()
    assert sum(sent.values()) >= 2000, sent
    # After all the fuzzing: the same loop, healthy, nothing held, same output.
    assert not watch.bad, watch.bad[:5]
    assert watch.polls > 100
    assert engine.is_running
    assert getattr(engine, "_thread", None) is engine_thread
    assert pages_all_free(engine, timeout=60)
    again = requests.post(server.base_url + "/v1/completions", json=GREEDY,
                          timeout=60).json()["choices"][0]["text"]
    assert again == greedy
    generate.stop()
    server.stop()


def check_response(path: str, resp: requests.Response) -> str | None:
    """What is wrong with an answer, or None."""
    if resp.status_code >= 500:
        return f"status {resp.status_code}: {resp.text[:300]}"
    if resp.status_code >= 400:
        try:
            err = resp.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"status {resp.status_code} without a JSON error: {resp.text[:200]}"
        if path != "/generate" and not (isinstance(err, dict)
                                        and err.get("code") == resp.status_code):
            return f"not OpenAI's error shape: {err!r}"[:300]
        return None
    if "text/event-stream" in resp.headers.get("content-type", ""):
        events = [line[6:] for line in resp.text.splitlines()
                  if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return f"a stream that does not end with [DONE]: {events[-2:]}"
        for event in events[:-1]:
            err = json.loads(event).get("error")
            if err is not None and err["code"] >= 500:
                return f"a 5xx error event in a stream: {err}"
    if "x-ndjson" in resp.headers.get("content-type", ""):
        for line in resp.text.splitlines():
            err = json.loads(line).get("error")
            if err is not None and json.loads(line).get("code", 500) >= 500:
                return f"a 5xx error line in a /generate stream: {line[:200]}"
    return None


def test_hypothesis_bodies_to_every_post_route(fuzzed):
    from hypothesis import HealthCheck, Phase, given, settings
    server, generate, _, sent_by = fuzzed
    session = requests.Session()
    calls, statuses, failures = collections.Counter(), collections.Counter(), []
    slowest: list = []
    started = time.time()
    for path in ENDPOINTS:
        base = generate.base_url if path == "/generate" else server.base_url

        @given(sent=request_bodies(path))
        @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None,
                  derandomize=True, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def run(sent):
            body, content_type = sent
            t0 = time.perf_counter()
            try:
                resp = session.post(base + path, data=body, timeout=120,
                                    headers={"content-type": content_type})
            except requests.RequestException as e:  # a dropped connection
                failures.append((path, body[:300], repr(e)))
                return
            slowest.append((time.perf_counter() - t0, path, resp.status_code,
                            body[:120]))
            calls[path] += 1
            statuses[resp.status_code] += 1
            problem = check_response(path, resp)
            if problem is not None:
                failures.append((path, body[:300], problem))

        run()
    print(f"\nhypothesis: {sum(calls.values())} requests in "
          f"{time.time() - started:.0f} s: {dict(calls)}; by status: "
          f"{dict(sorted(statuses.items()))}; slowest: "
          f"{sorted(slowest, reverse=True)[:3]}")
    sent_by["hypothesis"] += sum(calls.values())
    assert not failures, failures[:5]
    assert sum(calls.values()) >= 0.9 * EXAMPLES_PER_ROUTE * len(ENDPOINTS)
    assert statuses[200] >= 0.2 * sum(calls.values())  # it reached the engine
    assert sum(n for s, n in statuses.items() if 400 <= s < 500) >= 300


def test_schemathesis_every_check(fuzzed):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import CHECKS
    from schemathesis.config import (
        ChecksConfig,
        PositiveDataAcceptanceConfig,
        ProjectConfig,
        ProjectsConfig,
        SchemathesisConfig,
    )

    server, _, _, sent_by = fuzzed
    # Schema-valid requests may still be refused with 400 for what JSON
    # Schema cannot state (the prompt's token count against the context, n
    # > 1 with greedy sampling, both add_generation_prompt and
    # continue_final_message): 400 is an accepted answer to valid data, a
    # 422 or 5xx is not.
    config = SchemathesisConfig(projects=ProjectsConfig(default=ProjectConfig(
        checks=ChecksConfig(positive_data_acceptance=PositiveDataAcceptanceConfig(
            expected_statuses=["2xx", "400", "404"])))))
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json",
                                           config=config)
    checks = CHECKS.get_all()
    session = requests.Session()
    calls, statuses, failures = collections.Counter(), collections.Counter(), []
    started = time.time()
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {
        "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
        "/v1/models", "/health", "/metrics", "/version"}
    for op in ops:
        for mode in schemathesis.GenerationMode:
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=SCHEMATHESIS_EXAMPLES, deadline=None,
                      database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def run(case):
                resp = case.call(base_url=server.base_url, session=session,
                                 timeout=120)
                calls[op.label] += 1
                statuses[resp.status_code] += 1
                try:
                    case.validate_response(resp, checks=checks)
                except Exception as e:  # noqa: BLE001 - collected, asserted below
                    failures.append((op.label, mode.value, case.body,
                                     resp.status_code, str(e)[:500]))

            try:
                run()
            except Unsatisfiable:  # e.g. no invalid request exists for GET /health
                assert mode == schemathesis.GenerationMode.NEGATIVE
    print(f"\nschemathesis: {sum(calls.values())} requests in "
          f"{time.time() - started:.0f} s: {dict(calls)}; by status: "
          f"{dict(sorted(statuses.items()))}")
    sent_by["schemathesis"] += sum(calls.values())
    assert not failures, failures[:5]
    assert sum(calls.values()) >= 500
    assert statuses[200] >= 100  # the fuzzing also reached the engine
