"""examples/ (vLLM's documented examples with vllm replaced by jaxinfer) run
to completion and print what they promise: offline generation and chat,
the OpenAI completion and chat clients, and the /generate client."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from .conftest import ServerThread, start_server

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).parents[3]


def run_example(name: str, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def openai_server(tiny_model_factory):
    server, _ = start_server(tiny_model_factory(), served_model_names=["tiny"],
                             max_model_len=256, num_gpu_blocks_override=128,
                             max_num_seqs=8, max_num_batched_tokens=128)
    yield server
    server.stop()


def test_offline_inference_example(tiny_model_factory):
    out = run_example("offline_inference.py", tiny_model_factory())
    assert out.count("Prompt:") == 4 and out.count("Output:") == 4
    assert "'The capital of France is'" in out


def test_offline_chat_example(tiny_model_factory):
    out = run_example("offline_chat.py", tiny_model_factory())
    assert out.count("Generated text:") == 1 + 3


@pytest.mark.parametrize("stream", [False, True])
def test_openai_completion_client_example(openai_server, stream):
    out = run_example("openai_completion_client.py",
                      *(["--stream"] if stream else []),
                      env={"JAXINFER_API_BASE": openai_server.base_url + "/v1"})
    assert "Completion results:" in out
    if stream:
        assert out.count("Completion(") + out.count("CompletionChunk(") > 2
    else:  # n=2 choices, each with top-3 logprobs
        assert "index=1" in out and "top_logprobs=[{" in out


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_client_example(openai_server, stream):
    out = run_example("openai_chat_completion_client.py",
                      *(["--stream"] if stream else []),
                      env={"JAXINFER_API_BASE": openai_server.base_url + "/v1"})
    assert "Chat completion results:" in out
    assert ("ChatCompletionChunk(" if stream else "ChatCompletion(") in out


def test_api_client_example(tiny_model_factory):
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.api_server import build_app
    engine = AsyncLLMEngine.from_engine_args(EngineArgs(
        model=tiny_model_factory(), max_model_len=128,
        num_gpu_blocks_override=64, max_num_seqs=4, max_num_batched_tokens=64))
    server = ServerThread(build_app(engine))
    try:
        for extra in ([], ["--stream", "--n", "2"]):
            out = run_example("api_client.py", "--port", str(server.port), *extra)
            assert "Beam candidate 0: 'San Francisco is a" in out
            if extra:
                assert "Beam candidate 1:" in out
    finally:
        server.stop()
