"""Property-based fuzzing of the server from its own OpenAPI schema
(schemathesis): valid and invalid requests to every route, at least 500 in
all; none may get a 5xx, and the server stays healthy with no page held."""

from __future__ import annotations

import collections

import pytest
import requests

from .conftest import pages_all_free, start_server

pytestmark = pytest.mark.slow

EXAMPLES_PER_MODE = 80  # per operation and generation mode


@pytest.fixture(scope="module")
def fuzzed(tiny_model_factory):
    # A short context keeps every generated request quick: longer asks are 400s.
    server, engine = start_server(tiny_model_factory(), served_model_names=["tiny"],
                                  max_model_len=48, num_gpu_blocks_override=128,
                                  max_num_seqs=8, max_num_batched_tokens=64)
    yield server, engine
    server.stop()


def test_fuzz_all_routes_no_server_errors(fuzzed):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable

    server, engine = fuzzed
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
    session = requests.Session()
    calls: collections.Counter = collections.Counter()
    statuses: collections.Counter = collections.Counter()
    failures = []

    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/completions", "/v1/chat/completions",
                                       "/tokenize", "/detokenize", "/v1/models"}
    for op in ops:
        for mode in schemathesis.GenerationMode:
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES_PER_MODE, deadline=None,
                      database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(case):
                resp = case.call(base_url=server.base_url, session=session,
                                 timeout=60)
                calls[op.label] += 1
                statuses[resp.status_code // 100 * 100] += 1
                if resp.status_code >= 500:
                    failures.append((op.label, case.body, resp.status_code,
                                     resp.text[:300]))
                elif resp.status_code >= 400 and "application/json" in str(
                        resp.headers.get("content-type")):
                    err = resp.json().get("error")
                    assert isinstance(err, dict) and err["code"] == resp.status_code

            try:
                run()
            except Unsatisfiable:  # e.g. no invalid request exists for GET /health
                assert mode == schemathesis.GenerationMode.NEGATIVE

    print(f"\nschemathesis: {sum(calls.values())} requests: {dict(calls)}, "
          f"by status: {dict(statuses)}")
    assert not failures, failures[:5]
    assert sum(calls.values()) >= 500
    assert statuses[200] >= 100  # the fuzzing also reached the engine
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    assert pages_all_free(engine, timeout=60)
    assert engine.is_running
