"""The speed targets' arithmetic: the timelines' two bounds, the roofline's
bytes for quantized weights and pages, and the targets read back from a
run's folder (benchmarks/timeline_report.py, benchmarks/speed_targets.py)."""

import json
import os

import pytest

from benchmarks import speed_targets
from benchmarks.timeline_report import (
    LLAMA3_8B,
    model_constants,
    step_bounds,
    summarize,
)

ROOF = {"bw": 4e12, "flops": 800e12, "flops_fp8": 1600e12}


def _step(S: int, L: int) -> dict:
    return dict(prefill_tokens=0, decode_tokens=S, kv_tokens=S * L,
                attn_pairs=S * L, decode_only=True, compiles=0)


def test_serial_bound_adds_what_the_overlapped_one_takes_the_larger_of():
    m = LLAMA3_8B
    S, L = 256, 1024
    w = m["streamed_weight_bytes"] / ROOF["bw"]
    kv = S * L * m["kv_bytes_per_token"] / ROOF["bw"]
    mm = 2 * m["token_params"] * S / ROOF["flops"]
    att = m["attn_flops_per_pair"] * S * L / ROOF["flops"]
    over, serial = step_bounds(_step(S, L), ROOF)
    assert over == pytest.approx(max(w + kv, mm + att))
    assert serial == pytest.approx(max(w, mm) + max(kv, att))
    # At 256 rows the products are compute-bound and the pages memory-bound:
    # running them one after the other costs more than the larger of the two.
    assert mm > w and kv > att and serial > 1.05 * over
    # One sequence reads weights and pages alike: the two bounds agree.
    assert step_bounds(_step(1, 1024), ROOF)[1] == pytest.approx(
        step_bounds(_step(1, 1024), ROOF)[0])


def test_fp8_weights_multiply_at_the_fp8_rate():
    m = dict(LLAMA3_8B, quantization="fp8")
    big = _step(2048, 0) | {"prefill_tokens": 2048, "decode_tokens": 0,
                            "decode_only": False}
    bf16 = step_bounds(big, ROOF)[1]
    fp8 = step_bounds(big, ROOF, m)[1]
    assert fp8 == pytest.approx(bf16 / 2, rel=0.01)


def test_summary_reports_both_fractions():
    steps = [dict(_step(256, 1024), step=i, device_ms=20.0, host_ms=5.0,
                  compile_ms=0.0, preempted=0) for i in range(10)]
    s = summarize(steps, ROOF, elapsed_s=0.25)
    assert s["serial_fraction"] == pytest.approx(s["serial_bound_s"] / 0.25)
    assert s["serial_fraction"] > s["roofline_fraction"]
    assert s["by_kind"]["decode"]["serial_s"] == pytest.approx(s["serial_bound_s"])


def test_quantized_roofline_counts_stored_bytes():
    model = "benchmarks/models/llama3-8b"
    bf16 = model_constants(model)
    fp8 = model_constants(model, quantization="fp8", kv_cache_dtype="fp8")
    assert bf16["streamed_weight_bytes"] == pytest.approx(
        LLAMA3_8B["streamed_weight_bytes"], rel=0.01)
    assert fp8["token_params"] == bf16["token_params"]
    assert fp8["kv_bytes_per_token"] == bf16["kv_bytes_per_token"] // 2
    assert fp8["quantization"] == "fp8"
    # Each linear layer's weight drops to one byte (plus its f32 channel
    # scales); the lm_head (1.05 GB in bf16) is not quantized.
    lm_head = 2 * 128256 * 4096
    linear = bf16["streamed_weight_bytes"] - lm_head
    assert fp8["streamed_weight_bytes"] - lm_head == pytest.approx(
        linear / 2, rel=0.01)


def _summary(path, runs: dict) -> None:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"runs": runs}))


def _run(tok_s=None, ms=None, serial=None, over=None) -> dict:
    bench = {"output_tokens_per_s": tok_s, "ms_per_token": ms}
    return {"bench": bench, "timeline": {"serial_fraction": serial,
                                         "roofline_fraction": over}}


def test_targets_read_from_a_runs_folder(tmp_path):
    _summary(tmp_path / "bf16", {
        "tp1000-1000": _run(tok_s=9000.0, serial=0.86, over=0.8),
        "tp256-512": _run(tok_s=9000.0, serial=0.7, over=0.6),
        "lat128": _run(ms=4.6, over=0.77), "lat1024": _run(ms=4.0, over=0.9)})
    _summary(tmp_path / "int4", {"lat128": _run(ms=2.0), "lat1024": _run(ms=2.5)})
    (tmp_path / "fp8-attention").mkdir()
    (tmp_path / "fp8-attention" / "decode-fp8-mgpu-h200.json").write_text(
        json.dumps({"rows": [
            {"variant": "bf16", "pages": "bf16", "copy_bw_fraction": 0.95, "us": 1},
            {"variant": "fp8_default", "pages": "fp8", "copy_bw_fraction": 0.5, "us": 2},
            {"variant": "fp8_p4", "pages": "fp8", "copy_bw_fraction": 0.6, "us": 3}]}))
    rows = {r["target"].split(":")[0]: r for r in speed_targets.targets(str(tmp_path))}
    assert rows["bf16 tp1000-1000"]["holds"] is True
    assert rows["bf16 tp256-512"]["holds"] is False
    assert rows["bf16 batch 1 lat1024"]["holds"] is True
    assert rows["int4 AWQ batch 1 lat128"]["value"] == pytest.approx(2.3)
    assert rows["int4 AWQ batch 1 lat1024"]["holds"] is False  # 1.6x
    # The best fp8 variant counts; bf16 pages do not.
    assert rows["fp8 KV decode attention"]["variant"] == "fp8_p4"
    assert rows["fp8 KV decode attention"]["value"] == 0.6
    # A part that has not run leaves its targets open, not failed.
    fp8 = rows["fp8 weights + fp8 KV tp1000-1000"]
    assert fp8["value"] is None and fp8["holds"] is None


def test_a_cut_off_workload_is_summarized_up_to_its_last_step(tmp_path):
    from benchmarks.timeline_report import report_dir
    d = tmp_path / "fp8"
    d.mkdir()
    steps = [dict(_step(100, 1000), step=i, t_start_s=0.05 * i, device_ms=40.0,
                  host_ms=10.0, compile_ms=0.0, preempted=0, running=100,
                  num_steps=2 if i == 3 else 1) for i in range(4)]
    (d / "tp1000-1000.steps.jsonl").write_text(
        "\n".join(json.dumps(r) for r in steps))
    # No record for the workload: the engine was still running it.
    (d / "summary.json").write_text(json.dumps({"runs": {}, "roofline": ROOF}))
    report_dir(str(d))
    cut = json.loads((d / "summary.json").read_text())["cut_off"]["tp1000-1000"]
    assert cut["elapsed_s"] == pytest.approx(0.15 + 0.05)
    assert cut["decode_tokens"] == 100 * 5  # the last record is a two-step window
    assert cut["decode_tokens_per_s"] == pytest.approx(500 / 0.2)
    # The target stays open, and what the run decoded is kept beside it.
    rows = {r["target"].split(":")[0]: r for r in speed_targets.targets(str(tmp_path))}
    fp8 = rows["fp8 weights + fp8 KV tp1000-1000"]
    assert fp8["value"] is None and fp8["holds"] is None
    assert fp8["cut_off"]["decode_tokens"] == 500


def test_engine_parts_keep_their_programs_where_the_device_machine_keeps_them():
    # The device machine keeps the repository's ignored files between calls;
    # a part cut off in one call loads its programs in the next.
    cmd = speed_targets.part_command("fp8", "/tmp/out", ".tok", "default")
    assert cmd[cmd.index("--cache-dir") + 1] == os.path.abspath(speed_targets.CACHE_DIR)
    top = speed_targets.CACHE_DIR.split("/")[0]
    with open(".gitignore") as f:
        assert f"/{top}/" in f.read().split()
