"""Behaviour checks of the `vllm serve` flags, against one real
``python -m jaxinfer serve`` process started with all of the server's own
flags at once (``cli_server`` below). A flag that only sets an EngineArgs
field is checked by ``reaches_engine_args`` (the value lands in
EngineArgs) plus that field's own check in checks_engine.py; the process
also proves a few of those end to end (--max-model-len, --max-logprobs)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest
import requests

from jaxinfer.config import EngineArgs

from .registry import row_check

KEY = "walk-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
ENGINE_FIELDS = {f.name: f for f in dataclasses.fields(EngineArgs)}


@pytest.fixture(scope="module")
def cli_server(walk_model, walk_cache_dir, tmp_path_factory):
    """(base_url, stderr file): `jaxinfer serve` with every server flag."""
    from tests.jaxinfer.entrypoints.conftest import free_port
    tmp = tmp_path_factory.mktemp("cli-server")
    template = tmp / "template.jinja"
    template.write_text("CLI{% if tools %}TOOLS{% endif %}"
                        "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    port = free_port()
    argv = [sys.executable, "-m", "jaxinfer", "serve", walk_model,
            "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY,
            "--served-model-name", "first", "second",
            "--chat-template", str(template), "--return-tokens-as-token-ids",
            "--enable-server-load-tracking", "--enable-tokenizer-info-endpoint",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--exclude-tools-when-tool-choice-none",
            "--uvicorn-log-level", "warning", "--no-warmup",
            "--max-model-len", "64", "--max-logprobs", "2", "--dtype", "float32",
            "--num-gpu-blocks-override", "32", "--max-num-seqs", "2",
            "--max-num-batched-tokens", "32", "--api-server-count", "2",
            "--compilation-cache-dir", walk_cache_dir]
    err = open(tmp / "stderr", "w+")
    proc = subprocess.Popen(argv, stdout=err, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            err.seek(0)
            proc.kill()
            raise RuntimeError("jaxinfer serve did not start:\n" + err.read()[-3000:])
        time.sleep(0.5)
    yield url, err
    proc.terminate()
    proc.wait(60)
    err.close()


def complete(url, **body):
    return requests.post(url + "/v1/completions", headers=HEADERS, timeout=300,
                         json={"model": "first", "prompt": "one two",
                               "max_tokens": 2, **body})


@row_check("serve_flags", "host", "port", "model", "served_model_name",
           "api_key")
def serve_listens_and_names_the_model(cli_server):
    url, _ = cli_server
    assert requests.get(url + "/v1/models", timeout=30).status_code == 401
    models = requests.get(url + "/v1/models", headers=HEADERS, timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["first", "second"]
    assert models["data"][0]["max_model_len"] == 64
    for name in ("first", "second"):  # both accepted, each echoed (vLLM)
        r = complete(url, model=name)
        assert r.status_code == 200 and r.json()["model"] == name
    assert complete(url, model="tiny").status_code == 404


@row_check("serve_flags", "api_server_count")
def serve_starts_that_many_front_ends(cli_server):
    """Two HTTP front-end processes beside the engine core, under one
    supervising process."""
    import re
    _, err = cli_server
    err.seek(0)
    found = re.search(r"(\d+) API server process\(es\), engine core pid (\d+)",
                      err.read())
    assert found and found.group(1) == "2"
    core = int(found.group(2))
    with open(f"/proc/{core}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{parent}/task/{parent}/children") as f:
        children = [int(c) for c in f.read().split()]
    workers = []
    for c in children:
        with open(f"/proc/{c}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                workers.append(c)
    assert core in workers and len(workers) == 3


@row_check("serve_flags", "chat_template")
def serve_renders_chats_with_the_template_file(cli_server):
    url, _ = cli_server
    r = requests.post(url + "/tokenize", headers=HEADERS, timeout=30, json={
        "model": "first", "messages": [{"role": "user", "content": "hi"}],
        "return_token_strs": True})
    assert "".join(r.json()["token_strs"]).startswith("CLIhi")


@row_check("serve_flags", "return_tokens_as_token_ids")
def serve_shows_logprob_tokens_as_ids(cli_server):
    r = complete(cli_server[0], logprobs=1).json()
    assert all(t.startswith("token_id:")
               for t in r["choices"][0]["logprobs"]["tokens"])


@row_check("serve_flags", "enable_server_load_tracking",
           "enable_tokenizer_info_endpoint")
def serve_adds_the_endpoints_asked_for(cli_server):
    url, _ = cli_server
    assert requests.get(url + "/load", headers=HEADERS, timeout=30).json() == {
        "server_load": 0}
    info = requests.get(url + "/tokenizer_info", headers=HEADERS, timeout=30)
    assert info.status_code == 200 and info.json()["tokenizer_class"]


@row_check("serve_flags", "uvicorn_log_level")
def serve_logs_at_the_level_asked(cli_server):
    url, err = cli_server
    assert complete(url).status_code == 200
    err.seek(0)
    log = err.read()
    # at "info" uvicorn announces itself and logs every request
    assert "Uvicorn running" not in log and "POST /v1/completions" not in log


SPEC_JSON = '{"method": "ngram", "num_speculative_tokens": 2}'


@row_check("serve_flags", "max_model_len", "max_logprobs", "dtype",
           "num_gpu_blocks_override", "max_num_seqs", "max_num_batched_tokens",
           "tokenizer", "seed", "load_format", "tensor_parallel_size",
           "block_size", "gpu_memory_utilization", "swap_space",
           "enable_prefix_caching", "scheduling_policy",
           "enable_chunked_prefill", "async_scheduling",
           "guided_decoding_backend", "structured_outputs_config",
           "speculative_config")
def reaches_engine_args(rows, cli_server):
    """Each engine flag lands in EngineArgs with the value given (the
    field's own check proves what it does); the served process shows the
    limits of --max-model-len and --max-logprobs."""
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    values = {"tokenizer": "tok", "seed": "3", "load_format": "dummy",
              "tensor_parallel_size": "2", "block_size": "8",
              "gpu_memory_utilization": "0.5", "swap_space": "2",
              "max_model_len": "64", "max_logprobs": "2", "dtype": "bfloat16",
              "num_gpu_blocks_override": "32", "max_num_seqs": "3",
              "max_num_batched_tokens": "48", "scheduling_policy": "priority",
              "guided_decoding_backend": "guidance",
              "structured_outputs_config": '{"backend": "guidance"}',
              "speculative_config": SPEC_JSON}
    parsed = {"tokenizer": "tok", "dtype": "bfloat16", "load_format": "dummy",
              "guided_decoding_backend": "guidance",
              "structured_outputs_config": '{"backend": "guidance"}',
              "speculative_config": SPEC_JSON,
              "scheduling_policy": "priority", "gpu_memory_utilization": 0.5,
              "swap_space": 2.0}
    for row in rows:
        flag = "--" + row.replace("_", "-")
        if row in values:
            argv = [flag, values[row]]
            want = parsed[row] if row in parsed else int(values[row])
        else:  # a switch on by default
            assert ENGINE_FIELDS[row].default is True, row
            argv, want = ["--no-" + flag[2:]], False
        args = serve_engine_args(build_parser().parse_args(["serve", "m", *argv]))
        assert getattr(args, row) == want, (row, getattr(args, row))
    url, _ = cli_server
    long = complete(url, prompt=[5] * 70)
    assert long.status_code == 400 and "64" in long.text
    many = complete(url, logprobs=3)
    assert many.status_code == 400 and "max_logprobs" in many.text
