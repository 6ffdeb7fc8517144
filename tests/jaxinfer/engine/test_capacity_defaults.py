"""Batch capacity defaults: vLLM's on a GPU of 70 GiB or more (1024
sequences; 16384 batched tokens offline, 8192 for the server), 256 / 8192
on a smaller GPU, and CPU's own."""

import pytest

from jaxinfer import config
from jaxinfer.config import EngineArgs

MODEL_LEN = 8192


@pytest.fixture
def gpu_of(monkeypatch):
    def set_memory(gib: float) -> None:
        monkeypatch.setattr(config, "gpu_memory_bytes",
                            lambda: int(gib * 2**30))
    return set_memory


@pytest.mark.parametrize("context, tokens", [("llm", 16384), ("server", 8192)])
def test_large_gpu_takes_vllms_defaults(gpu_of, context, tokens):
    gpu_of(141)
    sc = EngineArgs(usage_context=context).scheduler_config(MODEL_LEN, on_cpu=False)
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (1024, tokens)


def test_smaller_gpu_keeps_256_sequences(gpu_of):
    gpu_of(40)
    sc = EngineArgs().scheduler_config(MODEL_LEN, on_cpu=False)
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (256, 8192)


def test_given_values_win_on_a_large_gpu(gpu_of):
    gpu_of(141)
    sc = EngineArgs(max_num_seqs=64, max_num_batched_tokens=2048,
                    usage_context="server").scheduler_config(MODEL_LEN, False)
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (64, 2048)
    # A token budget alone also bounds the default seat count.
    sc = EngineArgs(max_num_batched_tokens=512).scheduler_config(MODEL_LEN, False)
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (512, 512)


def test_cpu_defaults_are_unchanged(monkeypatch):
    def no_device_query():
        raise AssertionError("CPU defaults must not read device memory")
    monkeypatch.setattr(config, "gpu_memory_bytes", no_device_query)
    for context in ("llm", "server"):
        sc = EngineArgs(usage_context=context).scheduler_config(MODEL_LEN, True)
        assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (8, 256)


def test_unknown_usage_context_is_refused():
    with pytest.raises(ValueError, match="usage_context"):
        EngineArgs(usage_context="batch")


def parsed_serve(*argv: str):
    import argparse

    from jaxinfer.entrypoints.openai.cli_args import add_serve_args, serve_engine_args
    return serve_engine_args(add_serve_args(argparse.ArgumentParser())
                             .parse_args(list(argv)))


def test_serve_runs_in_the_server_context():
    assert parsed_serve("m").usage_context == "server"
    assert parsed_serve("m", "--usage-context", "llm").usage_context == "llm"


def test_a_multi_process_engine_takes_the_offline_defaults():
    """Its processes may be started by LLM(...) or serve: all agree."""
    args = parsed_serve("m", "--num-processes", "2", "--process-id", "1",
                        "--distributed-coordinator", "127.0.0.1:1")
    assert args.usage_context == "llm"
