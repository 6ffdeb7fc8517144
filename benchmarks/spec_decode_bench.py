"""Speculative decoding (n-gram lookup, a draft model, EAGLE-1 and EAGLE-3
heads) against plain decoding, one command:

    export PYTHONPATH=$PWD
    python3 benchmarks/spec_decode_bench.py --out $OUT \\
        --model benchmarks/models/llama3-8b --load-format dummy --tokenizer .tok
    python3 benchmarks/spec_decode_bench.py --tiny --out /tmp/sd   # CPU check

Workloads: greedy requests, ``--output-len`` tokens each (ignore_eos),
at each batch size of ``--batch-sizes`` (all requests added at once).
Each engine runs in its own child process (two 8B engines do not share
one GPU): one plain engine per workload, then one per method of
``--methods``. Each batch runs twice in its engine and the second run is
timed (the first builds the step programs it lands in; the prefix cache
is emptied between them, so both compute the same steps). Each method is
compared with the plain engine of its own workload (same target weights,
same prompts).

draft_model, eagle, eagle3: prompts that repeat a random run of 16-64
tokens. With random weights the target is shaped (`shape_target`, as
tests/tiny_models.py's make_eagle_target): embedding rows of RMS 0.02
and a first input norm that gives them back, and lm_head columns of the
ids outside a 32000-id draft vocabulary halved; its later layers have
their output projections (o_proj, down_proj) scaled by a factor, the
same in every engine of the workload (the target's speed does not
depend on its weights' values), so its first layer decides most of its
tokens. The draft model is the target's first ``--draft-layers``
layers, embeddings and head (``dummy.py`` draws each param from its
name, so a config with fewer layers shares them). The EAGLE heads
compute the target's first layer at the next token (`eagle_folder`:
make_eagle's construction from the target's drawn weights, fetched to
the host once, written in vLLM's layout and loaded through
speculative_config; EAGLE-1 has a trained head's shapes, EAGLE-3 twice
the attention heads). The first of these methods to run (draft_model if
it runs) picks the factor, from ``--agreement-scales``, whose acceptance
rate (4 rows of 128 tokens, other prompts than the timed ones) is
nearest ``--agreement`` (default 0.7); ``--agreement-scale`` sets it.

ngram (random weights): a target whose next token depends almost on the
current token alone (every layer's o_proj times
``--ngram-attention-scale``, lm_head columns outside 8 * prompt_len ids
halved), so its greedy path falls into a cycle, as a trained model
continues text that repeats. Its prompts are its own greedy output: a
start token (one per row) and the prompt_len - 1 tokens the plain
engine generates after it, kept when they end in a cycle of at most
prompt_len / 2 tokens seen twice (`cycle_prompts`); the continuation goes
round the cycle. With real weights ngram runs the draft_model prompts.

``--profile-steps N``: per engine and batch size, N steps once every row
is past its prompt under the JAX profiler (GPU kernels grouped as
step_breakdown.py groups them, busy and idle time) and under cProfile
(the host's functions by own time, ``host-ENGINE-S.txt``), with the
trace's host events and GPU kernels on one clock (``events-ENGINE-S.json``).

Writes ``spec-decode-bench.json``: per method and batch size the output
tok/s of both engines, the speedup, the acceptance rate and mean accepted
length (tokens emitted per drafted row: accepted drafts + 1); whether the
greedy tokens agree with plain decoding; what each workload did
(``workloads``: scales, the n-gram prompts' cycle lengths and rows found,
the share of plain tokens in the draft vocabulary; per EAGLE method its
head's shapes, differences from a trained head and largest difference
from the target's first layer); and the verdict of the targets
(batch 1 at least TARGETS['batch1_speedup_min'] times plain decoding,
batch 64 no slower). With random weights how often drafts are accepted
depends on how the model repeats itself, so read each speedup together
with its acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from spec_workloads import (
    EAGLE3_DRAFT_VOCAB,
    EMBED_RMS,
    OUTSIDE_DRAFT_VOCAB,
    draft_folder,
    draft_vocab_ids,
    eagle_folder,
    head_vs_target,
    ngram_prompts,
    ngram_target,
    prompts,
    scale_later_layers,
    shape_engine,
    workload_of,
)

TARGETS = {"batch1_speedup_min": 1.8, "batch64_speedup_min": 1.0}
CALIBRATION_ROWS, CALIBRATION_TOKENS = 4, 128
METHODS = ("ngram", "draft_model", "eagle", "eagle3")


def child(ns) -> dict:
    """One engine (speculative or plain) over every batch size."""
    from jaxinfer import LLM, SamplingParams
    spec, head = None, None
    dummy = ns.load_format == "dummy"
    workload = workload_of(ns, ns.child)
    if ns.child == "ngram":
        spec = {"method": "ngram",
                "num_speculative_tokens": ns.num_speculative_tokens,
                "prompt_lookup_max": ns.prompt_lookup_max,
                "prompt_lookup_min": ns.prompt_lookup_min}
    elif ns.child in ("eagle", "eagle3"):
        folder = ns.eagle_head
        if folder is None:  # dummy weights: the target's first layer
            folder, head = eagle_folder(ns, ns.child)
        spec = {"method": ns.child,
                "num_speculative_tokens": ns.num_speculative_tokens,
                "model": folder}
    elif ns.child == "draft_model":
        spec = {"method": "draft_model",
                "num_speculative_tokens": ns.num_speculative_tokens,
                "model": (ns.draft_model if ns.draft_model is not None
                          else draft_folder(ns))}
    kw = dict(model=ns.model, load_format=ns.load_format, dtype=ns.dtype,
              max_model_len=ns.max_model_len,
              max_num_seqs=max(ns.batch_sizes), speculative_config=spec,
              # The untimed first run builds the programs the workload
              # lands in; building every bucket's would only cost time.
              warmup=False)
    if ns.tokenizer:
        kw["tokenizer"] = ns.tokenizer
    if ns.timeline:  # one JSON line per step (the last batch size's run)
        kw["profile_steps"] = os.path.join(ns.out, f"steps-{ns.child}.jsonl")
    for pair in ns.engine:
        key, _, value = pair.partition("=")
        kw[key] = json.loads(value) if value[:1] in "0123456789[{tf" else value
    llm = LLM(**kw)
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    sp = SamplingParams(temperature=0.0, max_tokens=ns.output_len,
                        ignore_eos=True)
    record: dict = {"engine": ns.child, "workload": workload,
                    "batches": {}, "speculative_config": spec}
    cycles = None
    if dummy and workload == "ngram":
        record["target"] = ngram_target(engine, ns)
        cycles = ngram_prompts(llm, ns, vocab)
        record["ngram_prompts"] = {k: v for k, v in cycles.items()
                                   if k != "prompts"}
    elif dummy:
        shape_engine(engine, draft_vocab_ids(engine.runner.cfg, ns.seed))
        originals: dict = {}
        scale = ns.agreement_scale
        if ns.calibrate:
            scale, record["calibration"] = calibrate(llm, ns, vocab, originals)
        if scale is not None:
            scale_later_layers(engine, ns.draft_layers, scale, originals)
        record["later_layer_scale"] = scale
    if head is not None:
        head["max_abs_diff_to_target_layer0"] = head_vs_target(engine,
                                                               ns.child)
        record["head"] = head
    for S in ns.batch_sizes:
        rows = (cycles["prompts"][:S] if cycles is not None
                else prompts(S, ns.prompt_len, vocab, ns.seed + S))
        batch = [{"prompt_token_ids": p} for p in rows]
        llm.generate(batch, sp, use_tqdm=False)  # builds its programs
        # The timed run computes its prompts again (the same buckets).
        engine.reset_prefix_cache()
        before = engine.get_stats().spec_decode
        steps = engine.num_steps
        if engine.timeline is not None:
            engine.timeline.restart()
        t0 = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        row = {"seconds": seconds, "output_tokens": tokens,
               "output_tok_s": tokens / seconds,
               "steps": engine.num_steps - steps,
               "token_ids": [list(o.outputs[0].token_ids) for o in outs]}
        if engine.timeline is not None and engine.timeline.records:
            recs = engine.timeline.records
            row["timeline"] = {  # per step of the timed run, in ms
                "host_ms": sum(r.host_ms for r in recs) / len(recs),
                "device_ms": sum(r.device_ms for r in recs) / len(recs),
                "compile_ms_total": sum(r.compile_ms for r in recs),
                "buckets": sorted({f"{r.T}x{r.S}" for r in recs})}
        after = engine.get_stats().spec_decode
        if after is not None and before is not None:
            drafts = after.num_drafts - before.num_drafts
            draft_tokens = after.num_draft_tokens - before.num_draft_tokens
            accepted = after.num_accepted_tokens - before.num_accepted_tokens
            row.update(
                num_drafts=drafts, num_draft_tokens=draft_tokens,
                num_accepted_tokens=accepted,
                acceptance_rate=accepted / max(1, draft_tokens),
                mean_accepted_length=1 + accepted / max(1, drafts),
                accepted_per_pos=[a - b for a, b in zip(
                    after.accepted_per_pos, before.accepted_per_pos)])
        if ns.profile_steps:
            row["profile"] = profile_decode(
                engine, batch, sp, ns.profile_steps,
                os.path.join(ns.out, f"host-{ns.child}-{S}.txt"))
        record["batches"][str(S)] = row
    return record


def trace_events(trace_dir: str, min_us: float = 20.0,
                 limit: int = 4000) -> list:
    """The trace's host events (jit dispatch, transfers, waits) of at least
    ``min_us`` and its GPU kernels, on one clock from the first event:
    [line, name, start_us, duration_us], the first ``limit``."""
    import glob

    from jax.profiler import ProfileData
    events = []
    for path in glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"),
                          recursive=True):
        for plane in ProfileData.from_file(path).planes:
            gpu = plane.name.startswith("/device:GPU")
            if not gpu and not plane.name.startswith("/host:CPU"):
                continue
            for line in plane.lines:
                if gpu and "stream" not in line.name.lower():
                    continue
                for e in line.events:
                    dur = (e.end_ns - e.start_ns) / 1e3
                    if gpu or dur >= min_us:
                        events.append([f"{plane.name}/{line.name}"[:60],
                                       e.name[:100], e.start_ns, dur])
    events.sort(key=lambda e: e[2])
    t0 = events[0][2] if events else 0
    return [[ln, n, (s - t0) / 1e3, d] for ln, n, s, d in events[:limit]]


def profile_decode(engine, batch, sp, steps: int, host_path: str) -> dict:
    """GPU kernels of ``steps`` engine steps once every request of
    ``batch`` is past its prompt (decode or verifying steps only), grouped
    as step_breakdown.py groups them, with the wall time per step; the
    host's functions by own time (cProfile) into ``host_path``."""
    import cProfile
    import io
    import pstats

    import jax

    from benchmarks.step_breakdown import summarize_trace
    engine.reset_prefix_cache()
    ids = [engine.add_request(f"profile-{i}", b, sp)
           for i, b in enumerate(batch)]
    reqs = [engine.scheduler.requests[i] for i in ids]
    while any(r.num_computed_tokens <= r.num_prompt_tokens + 1 for r in reqs):
        engine.step()
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        host = cProfile.Profile()
        t0 = time.perf_counter()
        host.enable()
        for _ in range(steps):
            engine.step()
        host.disable()
        jax.effects_barrier()
        wall = time.perf_counter() - t0
        jax.profiler.stop_trace()
        out = summarize_trace(d, steps)
        with open(host_path.replace("host-", "events-").replace(
                ".txt", ".json"), "w") as f:
            json.dump(trace_events(d), f)
    out["wall_ms"] = wall * 1e3 / steps
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(40)
    with open(host_path, "w") as f:
        f.write(f"{steps} steps\n" + text.getvalue())
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return out


def calibrate(llm, ns, vocab: int, originals: dict) -> tuple[float, list]:
    """The scale of the target's later layers whose acceptance rate is
    nearest ns.agreement, and every scale's rate. Measured over
    CALIBRATION_ROWS rows of CALIBRATION_TOKENS tokens each (one short row
    is too few drafts: its rate swings by 0.2 between seeds)."""
    from jaxinfer import SamplingParams
    engine = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=CALIBRATION_TOKENS,
                        ignore_eos=True)
    batch = [{"prompt_token_ids": p}
             for p in prompts(CALIBRATION_ROWS, ns.prompt_len, vocab,
                              ns.seed + 1000)]
    tried = []
    for scale in ns.agreement_scales:
        scale_later_layers(engine, ns.draft_layers, scale, originals)
        before = engine.get_stats().spec_decode
        llm.generate(batch, sp, use_tqdm=False)
        after = engine.get_stats().spec_decode
        rate = ((after.num_accepted_tokens - before.num_accepted_tokens)
                / max(1, after.num_draft_tokens - before.num_draft_tokens))
        tried.append({"scale": scale, "acceptance_rate": rate})
        print(f"[calibrate] scale {scale}: acceptance {rate:.3f}", flush=True)
    best = min(tried, key=lambda t: abs(t["acceptance_rate"] - ns.agreement))
    return best["scale"], tried


def run_child(ns, which: str, scale: float | None,
              calibrate: bool = False) -> dict:
    path = os.path.join(ns.out, f"{which}.part.json")
    argv = [sys.executable, os.path.abspath(__file__), "--child", which,
            "--out", ns.out]
    for key in ("model", "load_format", "tokenizer", "dtype", "max_model_len",
                "output_len", "prompt_len", "seed", "num_speculative_tokens",
                "prompt_lookup_max", "prompt_lookup_min", "draft_model",
                "eagle_head", "draft_layers", "agreement",
                "ngram_attention_scale", "ngram_min_cycle"):
        value = getattr(ns, key)
        if value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    if ns.timeline:
        argv.append("--timeline")
    if ns.profile_steps:
        argv += ["--profile-steps", str(ns.profile_steps)]
    argv += ["--batch-sizes", ",".join(map(str, ns.batch_sizes)),
             "--agreement-scales", ",".join(map(str, ns.agreement_scales))]
    if scale is not None:
        argv += ["--agreement-scale", str(scale)]
    if calibrate:
        argv.append("--calibrate")
    for pair in ns.engine:
        argv += ["--engine", pair]
    subprocess.run(argv, check=True)
    with open(path) as f:
        return json.load(f)


def same_prefix(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean over rows of the share of tokens before the rows differ."""
    fractions = []
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q),
                 min(len(x), len(y)))
        fractions.append(n / max(1, len(x)))
    return sum(fractions) / max(1, len(fractions))


def summarize(ns, bases: dict[str, dict], specs: dict[str, dict]) -> dict:
    import jax

    from benchmarks.run_stamp import run_stamp
    methods = {}
    for method, spec in specs.items():
        base = bases[spec["workload"]]
        rows = {}
        for S in map(str, ns.batch_sizes):
            b, s = base["batches"][S], spec["batches"][S]
            rows[S] = {
                "plain_output_tok_s": b["output_tok_s"],
                "spec_output_tok_s": s["output_tok_s"],
                "speedup": s["output_tok_s"] / b["output_tok_s"],
                "plain_steps": b["steps"], "spec_steps": s["steps"],
                "same_tokens": b["token_ids"] == s["token_ids"],
                "plain_timeline": b.get("timeline"),
                "spec_timeline": s.get("timeline"),
                "plain_profile": b.get("profile"),
                "spec_profile": s.get("profile"),
                # bf16 on a GPU: verifying k + 1 positions in a ragged step
                # rounds differently from one-token decode steps, so greedy
                # paths of a random model part after near ties; the share
                # of each row's tokens before the first difference.
                "same_prefix_fraction": same_prefix(b["token_ids"],
                                                    s["token_ids"]),
                **{k: s[k] for k in ("acceptance_rate", "mean_accepted_length",
                                     "num_drafts", "num_draft_tokens",
                                     "num_accepted_tokens", "accepted_per_pos")
                   if k in s}}
        verdicts = {}
        if "1" in rows:
            verdicts["batch1_speedup"] = (
                rows["1"]["speedup"] >= TARGETS["batch1_speedup_min"])
        if "64" in rows:
            verdicts["batch64_no_slower"] = (
                rows["64"]["speedup"] >= TARGETS["batch64_speedup_min"])
        methods[method] = {
            "speculative_config": spec["speculative_config"],
            "workload": spec["workload"],
            "calibration": spec.get("calibration"),
            "verdicts": verdicts, "batches": rows}
        if spec.get("head"):
            methods[method]["head"] = spec["head"]
    workloads = {}
    dummy = ns.load_format == "dummy"
    if "layers" in bases:
        layers = {"later_layer_scale": bases["layers"].get("later_layer_scale"),
                  "draft_layers": ns.draft_layers,
                  "prompts": "a random run of 16-64 tokens repeated"}
        if dummy:
            layers.update(
                embed_rms=EMBED_RMS, first_input_norm_weight=(
                    "sqrt(embed_rms^2 + eps): its output is the embedding"),
                outside_draft_vocab_lm_head_scale=OUTSIDE_DRAFT_VOCAB,
                draft_vocab_size=EAGLE3_DRAFT_VOCAB,
                draft_vocab_share_of_plain_tokens=draft_vocab_share(
                    ns, bases["layers"]))
        workloads["layers"] = layers
    if "ngram" in bases:
        workloads["ngram"] = {
            **bases["ngram"].get("target", {}),
            "prompts": ("the model's own greedy output from a start token, "
                        "ending in a cycle"),
            **bases["ngram"].get("ngram_prompts", {})}
    return {"model": ns.model, "load_format": ns.load_format,
            "dtype": ns.dtype, "device": str(jax.devices()[0].device_kind),
            "workload": {"prompt_len": ns.prompt_len,
                         "output_len": ns.output_len,
                         "batch_sizes": ns.batch_sizes, "greedy": True},
            "workloads": workloads,
            "target_later_layer_scale": bases.get("layers", {}).get(
                "later_layer_scale"),
            "draft_layers": ns.draft_layers,
            "targets": TARGETS, "methods": methods, **run_stamp()}


def draft_vocab_share(ns, base: dict) -> dict | None:
    """Per batch size, the share of the plain engine's output tokens that
    lie in the EAGLE-3 draft vocabulary (None: the whole vocabulary)."""
    from jaxinfer.models import resolve_model
    ids = draft_vocab_ids(resolve_model(ns.model, "dummy").config, ns.seed)
    if ids is None:
        return None
    keep = set(ids.tolist())
    out = {}
    for S, row in base["batches"].items():
        toks = [t for r in row["token_ids"] for t in r]
        out[S] = sum(t in keep for t in toks) / max(1, len(toks))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true",
                   help="CPU check: the embedded model, small sizes")
    p.add_argument("--model", default="benchmarks/models/llama3-8b")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--batch-sizes", default="1,64",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeline", action="store_true",
                   help="each engine's step timeline: mean host and device "
                   "ms per step of each timed run into the JSON")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="per batch size, the GPU kernels of this many "
                   "decode-phase steps under the JAX profiler, grouped")
    p.add_argument("--methods", default="ngram,draft_model",
                   type=lambda s: s.split(","))
    p.add_argument("--draft-model", default=None,
                   help="the draft's folder (real weights); with dummy "
                   "weights the draft is the target's first --draft-layers")
    p.add_argument("--eagle-head", default=None,
                   help="the EAGLE head's folder for --methods eagle or "
                   "eagle3 (real weights); with dummy weights a head "
                   "computing the target's first layer is written")
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--agreement", type=float, default=0.7)
    p.add_argument("--agreement-scales", default="0.02,0.05,0.1,0.2,0.3,0.5",
                   type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--agreement-scale", type=float, default=None,
                   help="the later layers' scale (dummy weights), "
                   "no calibration")
    p.add_argument("--calibrate", action="store_true",
                   help=argparse.SUPPRESS)
    p.add_argument("--ngram-attention-scale", type=float, default=0.01,
                   help="the n-gram workload's target (dummy weights): "
                   "every layer's o_proj times this")
    p.add_argument("--ngram-min-cycle", type=int, default=1,
                   help="the shortest cycle an n-gram prompt may end in")
    p.add_argument("--engine", action="append", default=[],
                   metavar="KEY=VALUE", help="more engine arguments")
    p.add_argument("--child", choices=("plain", "plain-ngram") + METHODS,
                   help=argparse.SUPPRESS)
    ns = p.parse_args()
    os.makedirs(ns.out, exist_ok=True)
    if ns.tiny:  # the draft: the embedded model itself
        ns.model, ns.load_format, ns.tokenizer = "smollm2-135m-instruct", "auto", None
        ns.dtype, ns.max_model_len = "float32", 256
        ns.prompt_len, ns.output_len, ns.batch_sizes = 64, 24, [1, 4]
        ns.draft_model = ns.draft_model or ns.model
    unknown = set(ns.methods) - set(METHODS)
    if unknown:
        p.error(f"--methods {sorted(unknown)}: not among {', '.join(METHODS)}")
    eagle = {"eagle", "eagle3"} & set(ns.methods)
    if eagle and not ns.child:
        dummy = ns.load_format == "dummy"
        if dummy and ns.eagle_head is not None:
            p.error("--eagle-head with dummy weights: a head computing the "
                    "target's first layer is written; drop --eagle-head")
        if not dummy and ns.eagle_head is None:
            p.error(f"--methods {','.join(sorted(eagle))} with real weights "
                    "needs --eagle-head (the head's folder)")
        if len(eagle) > 1 and not dummy:
            p.error("one --eagle-head serves one of eagle and eagle3")
    if "draft_model" in ns.methods and not ns.child:
        dummy = ns.load_format == "dummy"
        if dummy and ns.draft_model is not None:
            p.error("--draft-model with dummy weights: the draft is the "
                    "target's first --draft-layers layers; drop --draft-model")
        if not dummy and ns.draft_model is None:
            p.error("--methods draft_model with real weights needs "
                    "--draft-model (the draft's folder)")
    if ns.child:
        record = child(ns)
        with open(os.path.join(ns.out, f"{ns.child}.part.json"), "w") as f:
            json.dump(record, f)
        return 0
    specs: dict[str, dict] = {}
    scale = None
    dummy = ns.load_format == "dummy"
    layers = [m for m in ns.methods if workload_of(ns, m) == "layers"]
    if dummy and layers and ns.agreement_scale is None:
        # First: it picks the later layers' scale (draft_model's if it runs).
        first = "draft_model" if "draft_model" in layers else layers[0]
        specs[first] = run_child(ns, first, None, calibrate=True)
        scale = specs[first].get("later_layer_scale")
    elif dummy:
        scale = ns.agreement_scale
    bases = {}
    if layers:
        bases["layers"] = run_child(ns, "plain", scale)
    if len(layers) < len(ns.methods):  # the n-gram workload (dummy)
        stale = os.path.join(ns.out, "ngram-prompts.json")
        if os.path.exists(stale):
            os.remove(stale)
        bases["ngram"] = run_child(ns, "plain-ngram", None)
    for method in ns.methods:
        if method not in specs:
            specs[method] = run_child(
                ns, method, scale if method in layers else None)
    result = summarize(ns, bases, {m: specs[m] for m in ns.methods})
    path = os.path.join(ns.out, "spec-decode-bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    for method, m in result["methods"].items():
        for S, row in m["batches"].items():
            print(f"{method:12s} S={S:>3}: {row['plain_output_tok_s']:8.1f} -> "
                  f"{row['spec_output_tok_s']:8.1f} tok/s, x{row['speedup']:.2f}, "
                  f"acceptance {row.get('acceptance_rate', 0):.2f}, mean length "
                  f"{row.get('mean_accepted_length', 0):.2f}, same tokens "
                  f"{row['same_tokens']}")
            for side in ("plain", "spec"):
                tl = row.get(f"{side}_timeline")
                if tl:
                    print(f"{'':12s}   {side}: host {tl['host_ms']:.2f} ms, "
                          f"device {tl['device_ms']:.2f} ms a step, "
                          f"compiles {tl['compile_ms_total']:.0f} ms, "
                          f"buckets {tl['buckets']}")
                pr = row.get(f"{side}_profile")
                if pr and pr.get("groups"):
                    groups = ", ".join(f"{g} {v['ms']:.2f}" for g, v in
                                       sorted(pr["groups"].items()))
                    print(f"{'':12s}   {side} profile: wall "
                          f"{pr['wall_ms']:.2f} ms, busy {pr['busy_ms']:.2f}, "
                          f"idle {pr['idle_ms']:.2f}; {groups}")
    print(json.dumps({m: r["verdicts"] for m, r in result["methods"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
