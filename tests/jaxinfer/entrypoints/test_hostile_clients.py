"""What a hostile client must not get: any route but /health (and /metrics)
without the API key; a 500 (or a different answer per route) for a body
nested thousands deep or not UTF-8; LoRA names that are long, hold control
characters or path parts; answers that echo such names in bulk or tell
which folders exist on the server."""

from __future__ import annotations

import json

import pytest
import requests

from .conftest import serve_app, start_engine, stop_engine

# The in-process and the multi-process server (conftest.py).
pytestmark = pytest.mark.both_servers

KEY = "hostile-clients-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENGINE = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=128,
              max_num_seqs=4, max_num_batched_tokens=32, enable_lora=True,
              max_loras=1, max_lora_rank=8)
COMPLETION = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": "tiny", "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]}
# Every route of a server with every optional route on, with a body each
# accepts (GET routes: None).
ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/invocations", COMPLETION),
    ("POST", "/tokenize", {"model": "tiny", "prompt": "Hi"}),
    ("POST", "/detokenize", {"model": "tiny", "tokens": [1, 2]}),
    ("GET", "/tokenizer_info", None),
    ("GET", "/load", None),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}),
    ("GET", "/docs", None),
    ("GET", "/redoc", None),
    ("GET", "/openapi.json", None),
    ("GET", "/version", None),
    ("GET", "/no-such-route", None),
]


@pytest.fixture(scope="module")
def engine(tiny_model_factory, server_mode):
    engine = start_engine(tiny_model_factory(), "tiny", server_mode, **ENGINE)
    yield engine
    stop_engine(engine)


def _serve(engine, **options):
    from jaxinfer.entrypoints.openai.api_server import build_app
    with pytest.MonkeyPatch.context() as mp:  # read when the app is built
        mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
        return serve_app(engine, build_app, ["tiny"],
                         enable_tokenizer_info_endpoint=True,
                         enable_server_load_tracking=True, **options)


@pytest.fixture(scope="module")
def keyed(engine):
    server = _serve(engine, api_key=KEY)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_server(engine):
    server = _serve(engine)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def generate_server(engine):
    from jaxinfer.entrypoints.api_server import build_app
    server = serve_app(engine, build_app)
    yield server
    server.stop()


def call(server, method, path, body=None, headers=None, data=None):
    return requests.request(method, server.base_url + path, json=body,
                            data=data, headers=headers or {}, timeout=60)


def openai_error(r, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    return err


# -- the API key ---------------------------------------------------------------

@pytest.mark.parametrize("method, path, body", ROUTES, ids=[r[1] for r in ROUTES])
def test_every_route_needs_the_key(keyed, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": KEY}):
        r = call(keyed, method, path, body, headers)
        err = openai_error(r, 401)
        assert err["type"] == "UnauthorizedError"
        assert r.headers["www-authenticate"] == "Bearer"
    r = call(keyed, method, path, body, AUTH)
    assert r.status_code != 401, r.text[:300]
    assert r.status_code < 500, r.text[:300]


def test_health_and_metrics_stay_open(keyed, engine):
    assert call(keyed, "GET", "/health").status_code == 200
    assert call(keyed, "GET", "/metrics").status_code == 200
    guarded = _serve(engine, api_key=KEY, api_key_protect_metrics=True)
    try:
        assert call(guarded, "GET", "/health").status_code == 200
        openai_error(call(guarded, "GET", "/metrics"), 401)
        r = call(guarded, "GET", "/metrics", headers=AUTH)
        assert r.status_code == 200 and "vllm:" in r.text
    finally:
        guarded.stop()


def test_protecting_metrics_needs_a_key(engine):
    from jaxinfer.entrypoints.openai.api_server import build_app
    with pytest.raises(ValueError, match="--api-key-protect-metrics needs "
                       "--api-key"):
        build_app(engine, ["tiny"], owns_engine=False,
                  api_key_protect_metrics=True)


# -- one body reader -----------------------------------------------------------

def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


POST_ROUTES = [(path, body) for method, path, body in ROUTES
               if method == "POST"]


@pytest.mark.parametrize("depth", [10_000, 129])
@pytest.mark.parametrize("path, body", POST_ROUTES,
                         ids=[p for p, _ in POST_ROUTES])
def test_deeply_nested_bodies_are_400(open_server, path, body, depth):
    key = next(k for k in body if k != "model")
    raw = json.dumps(body).replace(json.dumps(body[key]), nested(depth), 1)
    r = call(open_server, "POST", path, data=raw,
             headers={"content-type": "application/json"})
    err = openai_error(r, 400)
    assert "nested more than 128" in err["message"], err


@pytest.mark.parametrize("depth", [10_000, 129])
def test_deeply_nested_bodies_are_400_on_generate(generate_server, depth):
    r = call(generate_server, "POST", "/generate",
             data='{"prompt": ' + nested(depth) + "}",
             headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert "nested more than 128" in r.json()["error"]


def test_nesting_within_the_limit_is_read(open_server):
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2,
            "chat_template_kwargs": json.loads(nested(100))}
    r = call(open_server, "POST", "/v1/completions", body)
    err = openai_error(r, 400)  # read, then refused by name, not by depth
    assert "nested" not in err["message"]


@pytest.mark.parametrize("path, body", POST_ROUTES,
                         ids=[p for p, _ in POST_ROUTES])
def test_bodies_not_in_utf8_are_400(open_server, path, body):
    r = call(open_server, "POST", path,
             data=json.dumps(body).encode("utf-16"),
             headers={"content-type": "application/json"})
    err = openai_error(r, 400)
    assert "UTF-8" in err["message"], err


def test_server_serves_after_hostile_bodies(open_server):
    r = call(open_server, "POST", "/v1/completions", COMPLETION)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


# -- LoRA names and paths ------------------------------------------------------

@pytest.mark.parametrize("name", ["a" * 100_000, "a\x00b", "../../etc",
                                  "a/../b", "tab\tname", "x" * 129, ""],
                         ids=["100k-chars", "nul", "dot-dot", "inner-dot-dot",
                              "tab", "129-chars", "empty"])
def test_bad_lora_names_are_400_and_not_echoed(open_server, name):
    r = call(open_server, "POST", "/v1/load_lora_adapter",
             {"lora_name": name, "lora_path": "/nonexistent"})
    err = openai_error(r, 400)
    assert len(err["message"]) < 400, len(err["message"])
    if name:
        assert err["param"] == "lora_name"


def test_lora_load_is_no_directory_oracle(open_server, tmp_path):
    """No folder, a plain folder and a file answer alike, naming no path."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    answers = set()
    for path in ("/nonexistent", str(tmp_path / "plain"),
                 str(tmp_path / "file"), "/etc", "/proc/self/cwd"):
        r = call(open_server, "POST", "/v1/load_lora_adapter",
                 {"lora_name": "probe", "lora_path": path})
        err = openai_error(r, 404)
        assert path not in err["message"]
        answers.add(err["message"])
    assert len(answers) == 1, answers


def test_unknown_model_names_are_not_echoed_in_bulk(open_server):
    r = call(open_server, "POST", "/v1/completions",
             dict(COMPLETION, model="m" * 100_000))
    err = openai_error(r, 404)
    assert len(err["message"]) < 400 and "'tiny'" in err["message"]
    r = call(open_server, "POST", "/v1/unload_lora_adapter",
             {"lora_name": "u" * 100_000})
    assert len(openai_error(r, 404)["message"]) < 400
