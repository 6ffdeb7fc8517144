"""Writes docs/benchmarks.md and the README's headline table from the results
files under benchmarks/results/, so that every figure quoted there is the one
its file holds.

    python benchmarks/make_benchmarks_doc.py           # rewrite both
    python benchmarks/make_benchmarks_doc.py --check   # exit 1 if either is stale

``HEADLINES`` names, for each figure, the file it comes from and how it is read
from it; the rest of docs/benchmarks.md lists every results file with the
workload, device and date it records. ``tests/test_benchmarks_doc.py`` checks
that the committed files are what this script writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
README_BEGIN = "<!-- headline figures: written by benchmarks/make_benchmarks_doc.py -->"
README_END = "<!-- end of headline figures -->"


@dataclasses.dataclass(frozen=True)
class Headline:
    group: str  # the doc's section
    what: str  # the workload, in words
    path: str  # relative to benchmarks/results/
    figure: Callable[[dict], str]  # the results file's JSON -> the figure
    readme: bool = False  # also in the README's table


def _run(d: dict, name: str) -> dict:
    return d["runs"][name]


def _throughput(d: dict, name: str) -> str:
    r = _run(d, name)
    return (f"{r['bench']['output_tokens_per_s']:,.0f} output tok/s in "
            f"{r['bench']['elapsed_s']:.1f} s, "
            f"{r['timeline']['roofline_fraction']:.2f} of the run's roofline, "
            f"device busy {r['bench']['device_busy_fraction']:.0%}")


def _latency(d: dict, name: str) -> str:
    r = _run(d, name)
    return (f"{r['bench']['ms_per_token']:.1f} ms per token "
            f"({r['bench']['output_tokens_per_s']:.0f} tok/s), "
            f"{r['timeline']['roofline_fraction']:.2f} of the roofline")


def _vs_hf(d: dict) -> str:
    ours = _run(d, "tp256-512")["bench"]
    hf = d["peers"]["hf_tp256-512"]["output_tokens_per_s"]
    return (f"{ours['output_tokens_per_s']:,.0f} against {hf:,.0f} output "
            f"tok/s: {ours['vs_hf']:.1f}x")


def _ready(d: dict) -> str:
    return (f"{d['cold']['ready_s']:.1f} s cold ({d['cold']['programs']} "
            f"programs compiled), {d['warm']['ready_s']:.1f} s warm (all "
            f"{d['warm']['programs_loaded']} loaded from saved executables)")


def _decode_kernel(d: dict, case: str, chained: bool = False) -> str:
    """The engine's default kernel (``mosaic_decode_only``) against JAX's
    bundled kernel at the best of the settings tried; ``chained``: the
    medians of 16 calls in one program, where a single call is mostly the
    host's dispatch."""
    r = d["results"][case]
    key = "chained_median" if chained else "median"
    ours = next(v for v in r["ours"] if v["label"] == "mosaic_decode_only")[key]
    bundled = min(v[key] for v in r["bundled"] if key in v)
    frac = r["kv_bytes"] / d["bw_bytes_per_s"] / ours
    how = ", 16 calls per program" if chained else ""
    return (f"{ours * 1e6:.0f} us{how}: {frac:.0%} of copy bandwidth, "
            f"{bundled / ours:.2f}x JAX's bundled `paged_attention` at its "
            "best setting")


def _prefill_kernel(d: dict) -> str:
    r = d["results"]["prefill_8x2048"]
    return (f"{r['ours_tflops']:.0f} TFLOP/s, {r['frac_of_matmul']:.0%} of "
            f"the measured matmul rate; {r['ratio_to_cudnn']:.2f}x cuDNN")


def _sampler(d: dict) -> str:
    r = d["results"]["every_feature"]
    return (f"{r['ms']:.2f} ms, {d['every_feature_fraction_of_step_same_call']:.1%}"
            f" of the S=256 L=1024 decode step timed in the same call "
            f"({d['decode_step_same_call_ms']:.2f} ms)")


def _lora(d: dict) -> str:
    r = d["ratios_to_base"]
    return (f"{r['lora_mixed']:.2f}x the step without LoRA; one slot load "
            f"while serving stalls {d['stall_per_load_steps']:.2f} steps")


def _llava(d: dict) -> str:
    m = d["medians"]
    return (f"{m['output_tok_per_s']:,.0f} output tok/s; the image encoder "
            f"{m['encoder_share']:.1%} of step time")


def _rows(d: dict, **match) -> dict:
    return next(r for r in d["rows"]
                if all(r.get(k) == v for k, v in match.items()))


def _int4(d: dict) -> str:
    parts = []
    for s in (1, 256):
        b = _rows(d, variant="bf16", S=s)
        q = _rows(d, variant="int4-pallas", S=s)
        parts.append(f"S={s} {q['ms']:.2f} ms against bf16's {b['ms']:.2f} "
                     f"({b['ms'] / q['ms']:.2f}x)")
    return "; ".join(parts)


def _step_forms(d: dict) -> str:
    """The decode step in the engine's GPU form against each piece taken
    out: the separate q/k/v weights, the XLA path before attention."""
    parts = []
    for s in (1, 256):
        ours = _rows(d, variant="default", S=s)["ms"]
        sep = _rows(d, variant="separate", S=s)["ms"]
        xla = _rows(d, variant="xla_rope", S=s)["ms"]
        parts.append(f"S={s}: both {ours:.2f} ms, separate q/k/v {sep:.2f}, "
                     f"XLA's RoPE and write {xla:.2f}")
    return "; ".join(parts)


def _fp8_prefill(d: dict) -> str:
    b = _rows(d, variant="bf16")
    q = _rows(d, variant="fp8")
    return (f"{q['ms']:.0f} ms against bf16's {b['ms']:.0f} ms "
            f"({b['ms'] / q['ms']:.2f}x)")


def _tp(d: dict) -> str:
    same = d["results"]["tp2-pallas"]["equal_to_tp1_reference"]
    return "greedy tokens equal to one device's" if same else "tokens differ"


def _cpu_command(d: dict) -> str:
    return (f"{d['cli_warm']['wall_s']:.2f} s, first token at "
            f"{d['cli_warm']['first_token_s']:.2f} s (first run, empty "
            f"caches: {d['cli_cold']['wall_s']:.2f} s)")


def _cpu_rates(d: dict) -> str:
    one, many = d["single_stream_tok_s"], d["batched_8x64_tok_s"]
    return (f"one stream {one['jaxinfer']} tok/s ({one['ratio']:.2f}x HF "
            f"'s {one['hf']}); 8 x 64 tokens {many['jaxinfer']} "
            f"tok/s ({many['ratio']:.2f}x HF's {many['hf']})")


def _accuracy(d: dict) -> str:
    names = {(False, "per_tensor"): "per-tensor W8A8",
             (True, "per_token"): "per-channel weights, per-token activations",
             (True, "none"): "fp8 weights only"}
    return "; ".join(f"{names[(r['per_channel_weights'], r['activations'])]} "
                     f"{r['top1']:.1%}" for r in d["rows"]
                     if (r["per_channel_weights"], r["activations"]) in names)


def _span(xs: list[float]) -> str:
    lo, hi = f"{min(xs):.2f}", f"{max(xs):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _speculative(d: dict, batch: str) -> str:
    """Each method's output tok/s against plain decoding's, same target,
    prompts and process."""
    rows = {m: v["batches"][batch] for m, v in d["methods"].items()}
    accept = [r["acceptance_rate"] for r in rows.values()]
    plain = next(iter(rows.values()))["plain_output_tok_s"]
    return (f"plain {plain:,.0f} tok/s; "
            + ", ".join(f"{m} {r['speedup']:.2f}x" for m, r in rows.items())
            + f" (acceptance {_span(accept)})")


def _targets(d: dict) -> str:
    """The speed targets in one short line: values by kind, goal after."""
    kinds = (("bf16 tp", "bf16", ""), ("bf16 batch 1", "batch 1", ""),
             ("int4", "int4", "x"), ("fp8 KV decode", "fp8 attn", ""),
             ("fp8 weights", "fp8", " tok/s"))
    held = sum(1 for t in d["targets"] if t["holds"])
    parts = []
    for prefix, name, unit in kinds:
        rows = [t for t in d["targets"] if t["target"].startswith(prefix)]
        if not rows:
            continue
        if all(t["value"] is None for t in rows):
            cut = rows[0].get("cut_off")
            # The cut-off run's span and token count are in the file.
            parts.append(f"{name} {cut['decode_tokens_per_s']:,.0f} tok/s (cut off)"
                         if cut else f"{name} not run")
            continue
        fmt = "{:,.0f}" if unit == " tok/s" else "{:.2f}"
        values = ", ".join("-" if t["value"] is None else fmt.format(t["value"]) + unit
                           for t in rows)
        parts.append(f"{name} {values} ({fmt.format(rows[0]['goal'])}{unit})")
    return f"{held}/{len(d['targets'])} hold: " + "; ".join(parts)


ENGINE = "Engine, llama3-8b shape (random bf16 weights), one H200"
KERNELS = "Kernels and sampler, one H200 (S=64 L=2048 N=32 K=8 H=128, page 16, bf16 unless noted)"
FEATURES = "Features, one H200 (llama3-8b shape unless noted)"
CPU = "CPU, embedded SmolLM2-135M-Instruct, 2-core machine"
SPEC = ("Speculative decoding, llama3-8b shape (random bf16 weights shaped as "
        "docs/speculative-decoding.md says), k = 4, one H100")
SPEED = "engine-speed-8k-h200/summary.json"

HEADLINES = (
    Headline(ENGINE, "1000 prompts x 1000 in / 1000 out", SPEED,
             lambda d: _throughput(d, "tp1000-1000"), readme=True),
    Headline(ENGINE, "speed targets (H100)",
             "speed-targets-h100/targets.json", _targets, readme=True),
    Headline(ENGINE, "256 prompts x 1000 in / 1000 out", SPEED,
             lambda d: _throughput(d, "tp256-1000")),
    Headline(ENGINE, "256 x 512 in / 256 out, against HF transformers' continuous batching "
             "in the same script",
             SPEED, _vs_hf, readme=True),
    Headline(ENGINE, "one sequence, 128 in / 128 out", SPEED,
             lambda d: _latency(d, "lat128")),
    Headline(ENGINE, "one sequence, 1024 in / 256 out", SPEED,
             lambda d: _latency(d, "lat1024"), readme=True),
    Headline(ENGINE, "time to ready (weights loaded, every step program built)",
             "ready-final-h200.json", _ready, readme=True),
    Headline(KERNELS, "paged attention decode, S=64 L=2048", "kernel-decode-h200.json",
             lambda d: _decode_kernel(d, "decode_S64_L2048"), readme=True),
    Headline(KERNELS, "paged attention decode, S=1 L=32768", "kernel-decode-h200.json",
             lambda d: _decode_kernel(d, "decode_S1_L32768", chained=True)),
    Headline(KERNELS, "paged attention prefill, 8 x 2048 causal", "kernel-prefill-h200.json",
             _prefill_kernel, readme=True),
    Headline(KERNELS, "sampler with every feature on, S=256 V=128256", "sampler-h200.json",
             _sampler),
    Headline(FEATURES, "LoRA: decode step S=64 L=1024 with 8 rank-16 adapters in the batch",
             "lora-step-h200.json", _lora),
    Headline(FEATURES, "LLaVA-1.5-7b shape: 64 image + text requests, 128 tokens out",
             "llava-serve-h200.json", _llava),
    Headline(FEATURES, "int4 (AWQ layout) decode step, L=1024", "quant-step-int4-grouped-h200.json",
             _int4, readme=True),
    Headline(FEATURES, "decode step L=1024: one q/k/v weight and the RoPE/K-V write "
             "kernel, each against its absence (H100; the engine runs the kernel up "
             "to 16 rows)", "decode-step-rope-qkv-h100.json", _step_forms),
    Headline(FEATURES, "fp8 prefill, 8 x 2048 tokens", "quant-step-prefill-default-rows4-h200.json",
             _fp8_prefill),
    Headline(FEATURES, "tensor parallel 2 (tiny model, Pallas kernels), two H200s",
             "tp-check-h200x2.json",
             _tp),
    Headline(SPEC, "speculative decoding, one sequence, 512 in / 256 out, H100",
             "spec-decode-overlap-h100.json", lambda d: _speculative(d, "1"),
             readme=True),
    Headline(SPEC, "the same, 64 sequences", "spec-decode-overlap-h100.json",
             lambda d: _speculative(d, "64")),
    Headline(CPU, "`jaxinfer generate ... --max-tokens 32`, warm caches", "cpu-first-run.json",
             _cpu_command, readme=True),
    Headline(CPU, "decode rates against HF transformers (torch, float32), same file",
             "cpu-first-run.json", _cpu_rates, readme=True),
    Headline(CPU, "fp8 top-1 agreement with the float model, 1,000 positions",
             "fp8-schemes-accuracy-cpu.json", _accuracy),
)


def _load(path: str) -> dict:
    return json.loads((RESULTS / path).read_text())


def _link(path: str, prefix: str) -> str:
    return f"[`{path}`]({prefix}{path})"


def readme_table() -> str:
    """The README's rows link their files by reference, so that no line of
    the README grows past 200 characters."""
    lines = [README_BEGIN,
             "| workload | figure | results file |",
             "| --- | --- | --- |"]
    paths = []
    for h in HEADLINES:
        if h.readme:
            lines.append(f"| {h.what} | {h.figure(_load(h.path))} | [{h.path}] |")
            paths.append(h.path)
    lines.append("")
    lines += [f"[{p}]: benchmarks/results/{p}" for p in dict.fromkeys(paths)]
    lines.append(README_END)
    return "\n".join(lines)


def _describe(d) -> tuple[str, str, str]:
    """(workload, device, date) of a results file, '' where it has none."""
    if not isinstance(d, dict):
        return "", "", ""
    what = str(d.get("workload") or d.get("what") or "")
    if len(what) > 90:
        what = what[:what.rfind(" ", 0, 87)] + " ..."
    device = d.get("device") or (d.get("roofline") or {}).get("device") or ""
    date = str(d.get("date") or "")[:10]
    return what.replace("|", "/").replace("\n", " "), str(device), date


def _index() -> list[str]:
    rows = ["| file | workload | device | date |", "| --- | --- | --- | --- |"]
    for p in sorted(RESULTS.rglob("*")):
        rel = p.relative_to(RESULTS).as_posix()
        if p.is_dir():
            continue
        if p.parent != RESULTS and p.name != "summary.json":
            continue  # a run folder is listed by its summary
        what = device = date = ""
        if p.suffix == ".json":
            what, device, date = _describe(json.loads(p.read_text()))
        elif p.suffix in (".txt", ".md"):
            what = "text output (test run, profiler or notes)"
        rows.append(f"| {_link(rel, '../benchmarks/results/')} | {what} | "
                    f"{device} | {date} |")
    return rows


def benchmarks_doc() -> str:
    out = [
        "# Benchmark figures",
        "",
        "<!-- Written by benchmarks/make_benchmarks_doc.py from benchmarks/results/; "
        "do not edit. -->",
        "",
        "Every figure below is read from the results file named beside it. How the",
        "figures are measured (the roofline, the workloads, the results-file format)",
        "is in [benchmarking.md](benchmarking.md); what they say about the engine is in",
        "[performance.md](performance.md). Compare figures only within one file: each",
        "file is one run on one machine.",
    ]
    group = None
    for h in HEADLINES:
        if h.group != group:
            group = h.group
            out += ["", f"## {group}", "", "| workload | figure | results file |",
                    "| --- | --- | --- |"]
        out.append(f"| {h.what} | {h.figure(_load(h.path))} | "
                   f"{_link(h.path, '../benchmarks/results/')} |")
    out += ["", "## Every results file", "",
            "Folders of one run (`engine-speed-*`, `ready-executables-h200`, ...)",
            "are listed by their `summary.json`; the folder also holds the run's",
            "step timelines and log.", ""]
    out += _index()
    return "\n".join(out) + "\n"


def readme_with_table(text: str) -> str:
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    return text[:start] + readme_table() + text[end:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if docs/benchmarks.md or the README table is stale")
    args = ap.parse_args(argv)
    want = {DOC: benchmarks_doc(), README: readme_with_table(README.read_text())}
    stale = [p for p, text in want.items()
             if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is stale: run "
                  "python benchmarks/make_benchmarks_doc.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(want[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
