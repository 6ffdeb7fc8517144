"""`jaxinfer bench serving` against a real server on localhost."""

import json

import pytest

from jaxinfer.entrypoints.cli import main

from .conftest import pages_all_free, start_server


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    srv, engine = start_server(tiny_model_factory("llama"),
                               served_model_names=["tiny"],
                               num_gpu_blocks_override=128, max_model_len=128)
    yield srv, engine
    srv.stop()


@pytest.mark.parametrize("rate", ["inf", "40"])
def test_every_request_completes_with_consistent_timings(server, tmp_path, rate):
    srv, engine = server
    out = tmp_path / "serving.json"
    assert main(["bench", "serving", "--base-url", srv.base_url, "--model", "tiny",
                 "--num-prompts", "8", "--input-len", "12", "--output-len", "5",
                 "--request-rate", rate, "--max-model-len", "128",
                 "--output-json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["completed"] == 8 and rec["failed"] == 0
    assert rec["total_output_tokens"] == 8 * 5  # ignore_eos: full length
    assert rec["total_input_tokens"] == 8 * 12
    for r in rec["per_request"]:
        assert 0 < r["ttft"] <= r["e2el"]
        assert len(r["itl"]) >= 1  # more than one streamed chunk
    assert rec["ttft"]["median_ms"] <= rec["e2el"]["median_ms"]
    assert rec["tpot"]["median_ms"] > 0
    assert pages_all_free(engine)


def test_unknown_model_counts_as_failed(server, tmp_path):
    srv, _ = server
    assert main(["bench", "serving", "--base-url", srv.base_url, "--model",
                 "nope", "--num-prompts", "2", "--input-len", "4",
                 "--output-len", "2", "--output-json", str(tmp_path / "f.json")]) == 1
    rec = json.loads((tmp_path / "f.json").read_text())
    assert rec["failed"] == 2 and "HTTP 404" in rec["errors"][0]


def test_a_finished_request_without_text_is_completed():
    """Tokens that decode to an incomplete UTF-8 character stream no text:
    the request still completed (the server finished it)."""
    from jaxinfer.entrypoints.bench_serving import RequestResult, StreamReader
    reader = StreamReader(RequestResult(ok=False, prompt_len=3), start=0.0)
    for now, payload in [
            (0.1, {"choices": [{"index": 0, "text": ""}]}),
            (0.2, {"choices": [{"index": 0, "text": "",
                                "finish_reason": "length"}]}),
            (0.25, {"choices": [], "usage": {"completion_tokens": 2}})]:
        assert reader.feed(json.dumps(payload), now)
    assert not reader.feed("[DONE]", 0.3)
    res = reader.finish(0.3)
    assert res.ok and res.output_tokens == 2 and res.finish_reason == "length"
    assert res.ttft == pytest.approx(0.1) and res.itl == [pytest.approx(0.1)]


def test_a_stream_cut_before_its_finish_is_failed():
    from jaxinfer.entrypoints.bench_serving import RequestResult, StreamReader
    reader = StreamReader(RequestResult(ok=False, prompt_len=3), start=0.0)
    reader.feed(json.dumps({"choices": [{"index": 0, "text": "a"}]}), 0.1)
    reader.feed(json.dumps({"error": {"code": 500, "message": "engine died"}}),
                0.2)
    res = reader.finish(0.3)
    assert not res.ok and "engine died" in res.error


@pytest.mark.parametrize("clients", [2])
def test_several_client_processes_share_the_load(server, tmp_path, clients):
    srv, engine = server
    out = tmp_path / "serving.json"
    assert main(["bench", "serving", "--base-url", srv.base_url, "--model", "tiny",
                 "--num-prompts", "6", "--input-len", "8", "--output-len", "4",
                 "--num-clients", str(clients), "--max-model-len", "128",
                 "--output-json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["completed"] == 6 and rec["total_output_tokens"] == 6 * 4
    assert rec["client"]["processes"] == clients and rec["client"]["cpu_s"] > 0
    assert pages_all_free(engine)
