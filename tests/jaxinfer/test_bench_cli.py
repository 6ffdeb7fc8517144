"""`jaxinfer bench` on a config-only model with dummy weights."""

import gc
import json

import pytest

from jaxinfer.entrypoints.bench import synthetic_lengths
from jaxinfer.entrypoints.cli import main


@pytest.fixture(scope="module")
def config_only_model(tmp_path_factory):
    # A config.json and nothing else: load-format dummy needs no weights.
    path = tmp_path_factory.mktemp("cfg-only")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 4096, "max_position_embeddings": 256}))
    return str(path)


def _common(model, out):
    return ["--model", model, "--load-format", "dummy",
            "--tokenizer", "smollm2-135m-instruct", "--max-model-len", "64",
            "--max-num-seqs", "4", "--max-num-batched-tokens", "32",
            "--output-json", str(out)]


def test_throughput_runs_every_request_to_its_length(config_only_model, tmp_path):
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", *_common(config_only_model, out),
                 "--num-prompts", "6", "--input-len", "20",
                 "--output-len", "5", "--warmup", "buckets"]) == 0
    rec = json.loads(out.read_text())
    assert rec["num_requests"] == 6
    assert rec["prompt_tokens"] == 6 * 20
    assert rec["output_tokens"] == 6 * 5  # ignore_eos: every output full length
    assert rec["output_tokens_per_s"] == pytest.approx(30 / rec["elapsed_s"])
    assert rec["warmup_programs"] > 0  # compiles stayed out of the timing
    # The start-up heap was frozen while timing (entrypoints/heap.py), and
    # nothing stays frozen once the benchmark is done.
    assert rec["gc_frozen_objects"] > 10_000
    assert gc.get_freeze_count() == 0
    # Device time is part of the wall time, and the host's share is not 0.
    assert 0.0 < rec["device_busy_fraction"] < 1.0


def test_bench_warmup_defaults_to_dry_run():
    from jaxinfer.entrypoints.cli import build_parser
    for kind in ("throughput", "latency"):
        assert build_parser().parse_args(["bench", kind]).warmup == "dry-run"


def test_throughput_dry_run_warmup(config_only_model, tmp_path):
    out = tmp_path / "d.json"
    assert main(["bench", "throughput", *_common(config_only_model, out),
                 "--num-prompts", "3", "--input-len", "9", "--output-len", "4",
                 "--warmup", "dry-run"]) == 0
    rec = json.loads(out.read_text())
    assert rec["output_tokens"] == 12 and rec["warmup_programs"] == 0


def test_latency_reports_each_iteration(config_only_model, tmp_path):
    out = tmp_path / "l.json"
    assert main(["bench", "latency", *_common(config_only_model, out),
                 "--batch-size", "2", "--input-len", "8", "--output-len", "3",
                 "--num-iters", "3", "--num-iters-warmup", "1",
                 "--warmup", "none"]) == 0
    rec = json.loads(out.read_text())
    assert len(rec["latencies_s"]) == 3
    assert min(rec["latencies_s"]) <= rec["median_s"] <= max(rec["latencies_s"])


def test_sharegpt_synthetic_lengths_have_the_means_and_fit_the_context():
    import numpy as np
    lengths = synthetic_lengths("sharegpt-synthetic", 20000, 0, 0, 2048,
                                np.random.default_rng(0))
    ins, outs = np.array(lengths).T
    assert abs(ins.mean() - 215) < 15 and abs(outs.mean() - 200) < 15
    assert ins.max() <= 1024 and (ins + outs).max() <= 2048 and outs.min() >= 1
