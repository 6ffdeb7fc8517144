"""Single hostile requests: each is answered with a 4xx in OpenAI's shape, and the engine, the
streams in flight and /health carry on."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
import requests

from .conftest import pages_all_free, serve_app

# The in-process and the multi-process server (conftest.py).
pytestmark = pytest.mark.both_servers

SURROGATE = "\ud800"  # a lone surrogate: valid JSON (\ud800), invalid Unicode


def post(server, path, body, **kw):
    # json.dumps escapes the surrogate as \ud800, as a hostile client sends it.
    return requests.post(server.base_url + path, data=json.dumps(body),
                         headers={"content-type": "application/json"},
                         timeout=kw.pop("timeout", 60), **kw)


def openai_error(resp, status):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    return err


def stream_events(server, body):
    """All SSE data payloads of a streamed completion."""
    with requests.post(server.base_url + "/v1/completions", timeout=120,
                       json=dict(body, stream=True), stream=True) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines(decode_unicode=True)
                if line.startswith("data: ")]


def assert_alive(server, engine):
    assert engine.is_running
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    r = post(server, "/v1/completions",
             {"prompt": "Hello", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


# -- case 1: a bad bad_words entry --------------------------------------------

@pytest.mark.parametrize("path, base", [
    ("/v1/completions", {"prompt": "Hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
])
def test_bad_words_surrogate_is_400_and_streams_in_flight_finish(
        server, engine, path, base):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(stream_events, server, {
            "prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True,
            "temperature": 0})
        for _ in range(3):
            err = openai_error(post(server, path, dict(
                base, max_tokens=2, bad_words=[SURROGATE])), 400)
            assert "bad_words" in err["message"] and "Unicode" in err["message"]
        events = running.result(timeout=120)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    assert_alive(server, engine)


def test_bad_words_refused_by_the_engine_too(engine):
    """The same value through the Python-side path (no HTTP model in front)."""
    from jaxinfer import SamplingParams
    from jaxinfer.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match=r"bad_words\[1\]"):
        engine.input_processor.process(
            "Hi", SamplingParams(max_tokens=2, bad_words=["ok", SURROGATE]))


# -- case 2: /generate with token ids that are not integers ---------------------

@pytest.fixture(scope="module")
def generate_server(engine):
    from jaxinfer.entrypoints.api_server import build_app
    server = serve_app(engine, build_app)
    yield server
    server.stop()


@pytest.mark.parametrize("prompt", [
    {"prompt_token_ids": ["a"]}, {"prompt_token_ids": [1.5, 2.0]}, [1.5, 2.0],
    {"prompt_token_ids": [True]}, ["a", "b"], {"prompt_token_ids": []},
    {"prompt_token_ids": [1, 2], "extra": 1}, {"prompt": 5}, None,
])
def test_generate_non_integer_token_ids_are_400(generate_server, engine, prompt):
    r = post(generate_server, "/generate", {"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "prompt" in r.json()["error"]
    assert engine.is_running


@pytest.mark.parametrize("body, needle", [
    ({"n": 1000, "temperature": 1.0}, "n must be <= max_num_seqs"),
    ({"max_tokens": 2 ** 70}, "max_tokens"),
    ({"max_tokens": 127}, "maximum context length"),
    ({"temperature": 1e39}, "temperature"),
    ({"bad_words": [SURROGATE]}, "Unicode"),
])
def test_generate_out_of_range_values_are_400(generate_server, body, needle):
    r = post(generate_server, "/generate", dict(body, prompt="Hi there"))
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


def test_generate_still_serves_after_bad_requests(generate_server, server, engine):
    r = post(generate_server, "/generate",
             {"prompt": {"prompt_token_ids": [1, 2, 3]}, "max_tokens": 3})
    assert r.status_code == 200 and len(r.json()["text"]) == 1
    assert_alive(server, engine)


# -- case 3: a huge body is refused before it is read ---------------------------

def test_body_over_the_limit_is_413_and_the_loop_stays_responsive(server):
    from jaxinfer.entrypoints.http_guards import DEFAULT_MAX_BODY_BYTES
    body = json.dumps({"prompt": "a" * (DEFAULT_MAX_BODY_BYTES + 10)})
    for path in ("/v1/completions", "/tokenize", "/v1/chat/completions"):
        r = requests.post(server.base_url + path, data=body, timeout=30,
                          headers={"content-type": "application/json"})
        err = openai_error(r, 413)
        assert "--max-request-body-bytes" in err["message"]
        # The rest of the body is not read: the connection closes instead.
        assert r.headers["connection"] == "close"

    # Without a Content-Length (chunked), the count stops the upload too.
    def chunks():
        for _ in range(DEFAULT_MAX_BODY_BYTES // 65536 + 2):
            yield b"a" * 65536
    r = requests.post(server.base_url + "/tokenize", data=chunks(), timeout=30,
                      headers={"content-type": "application/json"})
    openai_error(r, 413)
    assert r.headers["connection"] == "close"


@pytest.mark.slow
def test_large_tokenize_runs_off_the_event_loop(server):
    """A prompt under the body limit takes seconds to tokenize; /health must
    answer meanwhile (it used to wait for the whole tokenization)."""
    import time
    text = "hello world, this is some text. " * 60000  # ~2 MB, seconds to encode
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.perf_counter()
        big = pool.submit(post, server, "/tokenize", {"prompt": text}, timeout=120)
        time.sleep(0.3)  # the big one is being tokenized now
        latencies = []
        while not big.done():
            t0 = time.perf_counter()
            assert requests.get(server.base_url + "/health", timeout=30).status_code == 200
            latencies.append(time.perf_counter() - t0)
        big_took = time.perf_counter() - started
        assert big.result().json()["count"] > 100000
    # Relative, so a loaded machine slows both sides alike: a /health that
    # waited for the tokenization would take about as long as it did.
    assert len(latencies) >= 3 and max(latencies) < big_took / 4, (latencies, big_took)


# -- case 4: lone surrogates anywhere in a body ------------------------------------

@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" + SURROGATE}]}),
    ("/v1/chat/completions", {"messages": [{"role": SURROGATE, "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": SURROGATE}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi",
                                            "x" + SURROGATE: 1}]}),
    ("/tokenize", {"prompt": SURROGATE}),
    ("/tokenize", {"messages": [{"role": "user", "content": SURROGATE}]}),
    ("/v1/completions", {"prompt": ["ok", SURROGATE]}),
    ("/v1/completions", {"prompt": "hi", "stop": [SURROGATE]}),
    ("/v1/completions", {"prompt": "hi", "model": SURROGATE}),
])
def test_lone_surrogates_are_400_in_openai_shape(server, path, body):
    err = openai_error(post(server, path, body), 400)
    assert "not valid Unicode" in err["message"]


@pytest.mark.parametrize("messages", [
    True, 3, "hi", {"role": "user"}, None,
    [{"role": "user", "content": [{"type": {"a": 1}}]}],  # unhashable type
    [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_messages_of_the_wrong_type_are_400_naming_messages(server, path,
                                                            messages):
    """Found by the fuzz: ``"messages": true`` and a content part whose
    ``type`` was a dict were 500s (the compatibility check iterated, then
    hashed, them before the model could refuse them)."""
    err = openai_error(post(server, path, {"messages": messages}), 400)
    assert "messages" in (err["param"] or "") + err["message"]


# -- case 7: clamps and float32 limits ---------------------------------------------

def test_logit_bias_is_clamped_and_huge_temperature_refused(server, engine):
    from jaxinfer import SamplingParams
    sp = SamplingParams(logit_bias={5: 1e308, 6: -1e308, "7": 3.0})
    assert sp.logit_bias == {5: 100.0, 6: -100.0, 7: 3.0}
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=1e39)
    # Over HTTP: the clamped bias still wins every step (it is not inf/NaN).
    r = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 4,
                                         "temperature": 0,
                                         "logit_bias": {"42": 1e308}})
    assert r.status_code == 200, r.text
    want = post(server, "/detokenize", {"tokens": [42] * 4}).json()["prompt"]
    assert r.json()["choices"][0]["text"] == want
    err = openai_error(post(server, "/v1/completions", {
        "prompt": "Hi", "temperature": 1e39}), 400)
    assert err["param"] == "temperature"


# -- case 8 (the parts without an API key) -----------------------------------------

def test_error_types_and_json_decode_param(server):
    from jaxinfer.entrypoints.openai.errors import error_type
    assert [error_type(s) for s in (400, 404, 413, 500, 503)] == [
        "BadRequestError", "NotFoundError", error_type(413),
        "InternalServerError", "ServiceUnavailableError"]
    assert not error_type(413).endswith("ErrorError")
    r = requests.post(server.base_url + "/v1/completions", data=b'{"prompt": "hi",',
                      headers={"content-type": "application/json"}, timeout=10)
    err = openai_error(r, 400)
    assert err["param"] is None and "not valid JSON" in err["message"]


# -- case 9: the OpenAPI schema says what the server does ----------------------------

def test_openapi_schema_matches_the_server(server, engine):
    schema = requests.get(server.base_url + "/openapi.json", timeout=10).json()
    health = schema["paths"]["/health"]["get"]["responses"]["200"]
    assert "content" not in health
    assert requests.get(server.base_url + "/health", timeout=10).content == b""
    metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    r = requests.get(server.base_url + "/metrics", timeout=10)
    assert r.headers["content-type"].startswith("text/plain")

    for path in ("/v1/completions", "/v1/chat/completions"):  # stream=true
        ok = schema["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(ok) == {"application/json", "text/event-stream"}

    vocab = engine.model.vocab_size
    detok = schema["components"]["schemas"]["DetokenizeRequest"]
    assert detok["properties"]["tokens"]["items"]["maximum"] == vocab - 1
    assert "x-limit" not in json.dumps(schema)
    assert post(server, "/detokenize", {"tokens": [vocab - 1]}).status_code == 200
    openai_error(post(server, "/detokenize", {"tokens": [vocab]}), 400)

    r = requests.get(server.base_url + "/v1/completions", timeout=10)
    openai_error(r, 405)
    assert r.headers["allow"] == "POST"


def test_nothing_leaked(server, engine):
    assert pages_all_free(engine, timeout=30)
    assert_alive(server, engine)
