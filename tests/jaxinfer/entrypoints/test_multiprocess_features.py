"""The multi-process server started from the command line: LoRA adapters
loaded at run time, client disconnects, the queue limit, images and a
data-parallel engine, across its front ends."""

from __future__ import annotations

import signal
import time

import pytest
import requests

from .cli_server import CliServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def adapters(tiny_model_factory, tmp_path_factory):
    from tests.lora_adapters import make_adapters
    return make_adapters(tiny_model_factory(),
                         str(tmp_path_factory.mktemp("mp-adapters")))


@pytest.fixture(scope="module")
def cli_server(tiny_model_factory, adapters, tmp_path_factory):
    names = list(adapters)
    server = CliServer(
        tiny_model_factory(), tmp_path_factory.mktemp("mp-cli"),
        "--api-server-count", "2", "--dtype", "float32",
        "--max-model-len", "128", "--num-gpu-blocks-override", "128",
        "--max-num-seqs", "2", "--max-num-batched-tokens", "32",
        "--max-num-waiting", "2", "--enable-lora", "--max-loras", "2",
        "--max-lora-rank", "8", "--lora-modules",
        f"{names[0]}={adapters[names[0]]}",
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    yield server
    server.stop()
    assert server.proc.returncode in (0, -signal.SIGTERM)


def greedy(server, model: str, prompt=(101, 102, 103, 104)) -> list[int]:
    r = requests.post(server.base_url + "/v1/completions", timeout=60, json={
        "model": model, "prompt": list(prompt), "max_tokens": 8,
        "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_lora_adapters_are_served_by_every_front_end(cli_server, adapters):
    static, runtime = list(adapters)[:2]
    base = greedy(cli_server, "tiny")
    assert greedy(cli_server, static) != base
    r = requests.post(cli_server.base_url + "/v1/load_lora_adapter", timeout=60,
                      json={"lora_name": runtime,
                            "lora_path": adapters[runtime]})
    assert r.status_code == 200, r.text
    # New connections reach both front ends: each serves the adapter one
    # of them loaded, and lists it.
    outputs = {tuple(greedy(cli_server, runtime)) for _ in range(6)}
    assert len(outputs) == 1 and list(outputs.pop()) != base
    for _ in range(4):
        models = requests.get(cli_server.base_url + "/v1/models", timeout=30)
        assert {m["id"] for m in models.json()["data"]} == {"tiny", static,
                                                            runtime}
    again = requests.post(cli_server.base_url + "/v1/load_lora_adapter",
                          timeout=60, json={"lora_name": runtime,
                                            "lora_path": adapters[runtime]})
    assert again.status_code == 400
    r = requests.post(cli_server.base_url + "/v1/unload_lora_adapter",
                      timeout=60, json={"lora_name": runtime})
    assert r.status_code == 200, r.text
    for _ in range(4):
        r = requests.post(cli_server.base_url + "/v1/completions", timeout=60,
                          json={"model": runtime, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 404


def test_structured_outputs_cross_to_the_engine_core(cli_server):
    """A front end checks the grammar (a bad one is its 400); the core
    compiles its own and constrains every token of the answer."""
    url = cli_server.base_url + "/v1/completions"
    for _ in range(3):  # new connections reach either front end
        r = requests.post(url, timeout=60, json={
            "model": "tiny", "prompt": "pick", "max_tokens": 20,
            "temperature": 0, "guided_choice": ["alpha", "beta", "gamma"]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] in ("alpha", "beta", "gamma")
    r = requests.post(url, timeout=60, json={
        "model": "tiny", "prompt": "pick", "max_tokens": 20,
        "guided_regex": "(unclosed"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400


def test_disconnect_aborts_and_frees_pages(cli_server):
    r = requests.post(cli_server.base_url + "/v1/completions", stream=True,
                      timeout=60, json={"model": "tiny", "prompt": "go on",
                                        "stream": True, "max_tokens": 120,
                                        "ignore_eos": True})
    lines = r.iter_lines()
    got = 0
    while got < 3:
        if next(lines):
            got += 1
    r.close()  # the client hangs up mid-stream
    deadline = time.time() + 20
    while time.time() < deadline:
        if (cli_server.gauge("jaxinfer:num_requests_running") == 0
                and cli_server.gauge("jaxinfer:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.1)
    assert cli_server.gauge("jaxinfer:num_requests_running") == 0
    assert cli_server.gauge("jaxinfer:kv_cache_usage_perc") == 0


def test_queue_limit_refuses_with_503(cli_server):
    """max_num_seqs=2 run, --max-num-waiting 2 wait: the rest are refused
    with 503 and Retry-After, by whichever front end takes them."""
    import concurrent.futures
    body = {"model": "tiny", "prompt": "count", "max_tokens": 100,
            "ignore_eos": True}

    def post(_):
        r = requests.post(cli_server.base_url + "/v1/completions", json=body,
                          timeout=120)
        return r.status_code, r.headers.get("Retry-After")

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, range(12)))
    codes = [c for c, _ in answers]
    # Adds still in flight count as waiting (as in one process), so the
    # admitted may be fewer than the seats plus the queue.
    assert codes.count(200) >= 2 and codes.count(503) >= 1, codes
    assert set(codes) <= {200, 503}
    assert all(retry for c, retry in answers if c == 503)


def test_images_reach_the_engine_core(tiny_llava_path, tmp_path):
    """A front end preprocesses the image; the core gets its pixels and
    answers as HF's LLaVA does."""
    from tests.tiny_llava import HfLlava, random_image

    from .test_image_server import MAX_TOKENS, QUESTION, data_url, hf_text
    server = CliServer(tiny_llava_path, tmp_path, "--api-server-count", "1",
                       "--max-model-len", "128", "--num-gpu-blocks-override",
                       "64", "--max-num-seqs", "4", "--max-num-batched-tokens",
                       "32", "--limit-mm-per-prompt", '{"image": 2}')
    try:
        image = random_image(3)
        r = requests.post(server.base_url + "/v1/chat/completions", timeout=120,
                          json={"model": "tiny", "max_tokens": MAX_TOKENS,
                                "temperature": 0, "messages": [{
                                    "role": "user", "content": [
                                        {"type": "image_url",
                                         "image_url": {"url": data_url(image)}},
                                        {"type": "text", "text": QUESTION}]}]})
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["message"]["content"]
        assert got == hf_text(HfLlava(tiny_llava_path), [image])
        too_many = requests.post(server.base_url + "/v1/chat/completions",
                                 timeout=60, json={
                                     "model": "tiny", "max_tokens": 2,
                                     "messages": [{"role": "user", "content": [
                                         {"type": "image_url", "image_url": {
                                             "url": data_url(image)}}] * 3}]})
        assert too_many.status_code == 400
    finally:
        server.stop()


def test_data_parallel_replicas_behind_the_engine_core(tiny_model_factory,
                                                       tmp_path):
    """The core hosts a data-parallel engine (two replicas on two CPU
    devices): concurrent requests, routed to either replica, give
    `LLM.generate`'s greedy tokens."""
    import concurrent.futures

    from jaxinfer import LLM, SamplingParams
    model = tiny_model_factory()
    prompts = [[101 + i, 102, 103, 104 + i] for i in range(6)]
    llm = LLM(model=model, max_model_len=128, num_gpu_blocks_override=64,
              max_num_seqs=4, max_num_batched_tokens=32)
    want = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=8))]
    server = CliServer(model, tmp_path, "--api-server-count", "2",
                       "--data-parallel-size", "2", "--max-model-len", "128",
                       "--num-gpu-blocks-override", "64", "--max-num-seqs", "4",
                       "--max-num-batched-tokens", "32",
                       env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            got = list(pool.map(lambda p: greedy(server, "tiny", p), prompts))
        assert got == want
    finally:
        server.stop()
