"""API key (401), the optional waiting-queue limit (503), vLLM's simple
/generate server, and the `jaxinfer serve` flags."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
import requests

from .conftest import ServerThread, pages_all_free, start_server

KEY = "s3cret-key"
TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def guarded(tiny_model_factory):
    server, engine = start_server(tiny_model_factory(), served_model_names=["tiny"],
                                  api_key=KEY, max_num_waiting=2,
                                  chat_template=TEMPLATE,
                                  max_model_len=128, num_gpu_blocks_override=256,
                                  max_num_seqs=1, max_num_batched_tokens=128)
    yield server, engine
    server.stop()


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_api_key_required_on_v1(guarded):
    server, _ = guarded
    url = server.base_url + "/v1/models"
    for headers in ({}, _auth("wrong"), _auth(KEY + "x"), {"Authorization": KEY}):
        r = requests.get(url, headers=headers, timeout=10)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == 401
    assert requests.get(url, headers=_auth(KEY), timeout=10).status_code == 200
    # The scheme is case-insensitive (RFC 7235); a 401 says which one to use.
    for scheme in ("bearer", "BEARER", "Bearer "):
        r = requests.get(url, headers={"Authorization": f"{scheme} {KEY}"},
                         timeout=10)
        assert r.status_code == 200, scheme
    r = requests.get(url, headers=_auth("wrong"), timeout=10)
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "UnauthorizedError"
    # Probes' routes stay open (test_hostile_clients.py: every other one
    # needs the key).
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    assert requests.get(server.base_url + "/metrics", timeout=10).status_code == 200


def test_chat_template_flag(guarded):
    server, engine = guarded
    messages = [{"role": "user", "content": "Hi there"}]
    r = requests.post(server.base_url + "/tokenize", json={"messages": messages},
                      headers=_auth(KEY), timeout=10)
    want = engine.tokenizer.encode("[user] Hi there\n[assistant] ",
                                   add_special_tokens=False)
    assert r.json()["tokens"] == want
    r = requests.post(server.base_url + "/v1/chat/completions", headers=_auth(KEY),
                      timeout=60, json={"messages": messages, "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens"] == len(want)


def test_queue_limit_answers_503(guarded):
    server, engine = guarded

    def one(_):
        return requests.post(server.base_url + "/v1/completions", headers=_auth(KEY),
                             timeout=120, json={"model": "tiny", "prompt": "hi",
                                                "max_tokens": 30, "ignore_eos": True})

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(10)))
    codes = sorted(r.status_code for r in results)
    assert set(codes) == {200, 503}, codes
    # One running plus at most two waiting were ever admitted.
    assert 1 <= codes.count(200) <= 3 + 2  # +2: seats freed while others queued
    full = next(r for r in results if r.status_code == 503).json()["error"]
    assert full["code"] == 503 and "max-num-waiting" in full["message"]
    for r in results:
        if r.status_code == 200:
            assert r.json()["usage"]["completion_tokens"] == 30
        else:
            assert r.headers["retry-after"] == "1"
    assert pages_all_free(engine)


def test_queue_full_503_arrives_at_once(guarded):
    """With the queue full, a refusal must not wait behind the queue (it used
    to take 11-20 s: the prompt was tokenized on the event loop first).

    The property is relative, so a loaded CI machine cannot break it: every
    refusal comes back while the queue is still full and no admitted request
    has finished. Steps are paced (0.1 s, a slow model's) only while the
    refusals are measured, so the first admitted request alone needs 10 s."""
    import time
    server, engine = guarded
    url = server.base_url + "/v1/completions"
    long = {"model": "tiny", "prompt": "hi", "max_tokens": 100, "ignore_eos": True}
    # Warm-up with the same shapes, so no compile lands in the measured part.
    assert requests.post(url, headers=_auth(KEY), json=long,
                         timeout=300).status_code == 200
    real_step = engine.engine.step

    def paced_step():
        time.sleep(0.1)
        return real_step()
    engine.engine.step = paced_step
    try:
        _refusals_while_full(server, engine, url, long,
                             unpace=lambda: setattr(engine.engine, "step", real_step))
    finally:
        engine.engine.step = real_step


def _refusals_while_full(server, engine, url, long, unpace):
    import time
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        held = [pool.submit(requests.post, url, headers=_auth(KEY), json=long,
                            timeout=300)]
        deadline = time.time() + 30
        # The first one running before the others queue (all three at once
        # would count as waiting, and the third would be refused).
        while engine.engine.scheduler.num_running < 1 and time.time() < deadline:
            time.sleep(0.01)
        held += [pool.submit(requests.post, url, headers=_auth(KEY), json=long,
                             timeout=300) for _ in range(2)]
        while not engine.queue_full() and time.time() < deadline:
            time.sleep(0.02)
        assert engine.queue_full()
        waits = []
        for body in ({"model": "tiny", "prompt": "word " * 100, "max_tokens": 2},
                     {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}):
            for path in ("/v1/completions", "/v1/chat/completions"):
                t0 = time.perf_counter()
                r = requests.post(server.base_url + path, headers=_auth(KEY),
                                  json=body, timeout=30)
                waits.append(time.perf_counter() - t0)
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "ServiceUnavailableError"
        # Still full, nothing admitted has finished: no refusal waited for a seat.
        assert engine.queue_full() and not any(f.done() for f in held), waits
        unpace()
        assert all(f.result().status_code == 200 for f in held)
    assert pages_all_free(engine)


def test_queue_limit_is_on_by_default():
    from jaxinfer.engine.async_engine import DEFAULT_MAX_NUM_WAITING, AsyncLLMEngine
    from jaxinfer.entrypoints.cli import build_parser
    assert DEFAULT_MAX_NUM_WAITING is not None and DEFAULT_MAX_NUM_WAITING > 0
    ns = build_parser().parse_args(["serve", "m"])
    assert ns.max_num_waiting == DEFAULT_MAX_NUM_WAITING
    import inspect
    default = inspect.signature(AsyncLLMEngine).parameters["max_num_waiting"].default
    assert default == DEFAULT_MAX_NUM_WAITING


def test_simple_generate_server(tiny_model_factory):
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.api_server import build_app
    kw = dict(max_model_len=128, num_gpu_blocks_override=64, max_num_seqs=4,
              max_num_batched_tokens=64)
    path = tiny_model_factory()
    engine = AsyncLLMEngine.from_engine_args(EngineArgs(model=path, **kw))
    server = ServerThread(build_app(engine))
    try:
        want = LLM(path, **kw).generate(
            "Hello", SamplingParams(max_tokens=6, temperature=0), use_tqdm=False)
        body = {"prompt": "Hello", "max_tokens": 6, "temperature": 0}
        r = requests.post(server.base_url + "/generate", json=body, timeout=60)
        assert r.status_code == 200
        assert r.json() == {"text": ["Hello" + want[0].outputs[0].text]}
        r = requests.post(server.base_url + "/generate", json=dict(body, stream=True),
                          stream=True, timeout=60)
        lines = [json.loads(x) for x in r.iter_lines() if x]
        assert lines[-1] == {"text": ["Hello" + want[0].outputs[0].text]}
        assert all(b["text"][0].startswith(a["text"][0])
                   for a, b in zip(lines, lines[1:]))  # cumulative text
        bad = requests.post(server.base_url + "/generate",
                            json={"prompt": "x", "top_p": 5}, timeout=10)
        assert bad.status_code == 400 and "top_p" in bad.json()["error"]
        bad = requests.post(server.base_url + "/generate",
                            json={"prompt": "x", "no_such_field": 1}, timeout=10)
        assert bad.status_code == 400 and "no_such_field" in bad.json()["error"]
        assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    finally:
        server.stop()


def test_serve_flags_map_to_engine_args():
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import UnsupportedQuantizationError, serve_engine_args
    ns = build_parser().parse_args([
        "serve", "/models/x", "--port", "9001", "--host", "0.0.0.0",
        "--api-key", "k", "--served-model-name", "a", "b", "--max-num-seqs", "7",
        "--max-model-len", "256", "--block-size", "32", "--max-logprobs", "5",
        "--gpu-memory-utilization", "0.5", "--no-enable-prefix-caching",
        "--max-num-waiting", "3", "--tensor-parallel-size", "2"])
    args = serve_engine_args(ns)
    assert (args.model, args.max_num_seqs, args.max_model_len, args.block_size,
            args.max_logprobs, args.gpu_memory_utilization,
            args.enable_prefix_caching, args.tensor_parallel_size) == \
        ("/models/x", 7, 256, 32, 5, 0.5, False, 2)
    assert (ns.port, ns.host, ns.api_key, ns.served_model_name,
            ns.max_num_waiting) == (9001, "0.0.0.0", "k", ["a", "b"], 3)
    ns = build_parser().parse_args(["serve", "m", "--quantization",
                                    "bitsandbytes"])
    with pytest.raises(UnsupportedQuantizationError, match="--quantization"):
        serve_engine_args(ns)
