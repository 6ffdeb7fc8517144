"""Speculative decoding (n-gram lookup, a draft model, EAGLE-1 and EAGLE-3
heads) against plain decoding, one command:

    export PYTHONPATH=$PWD
    python3 benchmarks/spec_decode_bench.py --out $OUT \\
        --model benchmarks/models/llama3-8b --load-format dummy --tokenizer .tok
    python3 benchmarks/spec_decode_bench.py --tiny --out /tmp/sd   # CPU check

Workload: greedy requests whose prompts repeat a random run of tokens
(which favours n-gram lookup), ``--output-len`` tokens each (ignore_eos),
at each batch size of ``--batch-sizes`` (all requests added at once).
Each engine runs in its own child process (two 8B engines do not share
one GPU): plain decoding, then one per method of ``--methods``. Each batch
runs twice in its engine and the second run is timed (the first builds
the step programs it lands in; the prefix cache is emptied between them,
so both compute the same steps).

The draft model (random weights): the target's first ``--draft-layers``
layers, embeddings and head (``dummy.py`` draws each param from its name,
so a config with fewer layers shares them). A random model's layers each
add about as much to the residual stream, so such a draft would rarely
agree; the target's later layers therefore have their output projections
(o_proj, down_proj) scaled by a factor, the same in every engine (the
target's speed does not depend on its weights' values). The draft's child
runs first and picks the factor, from ``--agreement-scales``, whose
acceptance rate (4 rows of 128 tokens, other prompts than the timed ones)
is nearest ``--agreement`` (default 0.7).

``--profile-steps N``: per engine and batch size, N steps once every row
is past its prompt under the JAX profiler (GPU kernels grouped as
step_breakdown.py groups them, busy and idle time) and under cProfile
(the host's functions by own time, ``host-ENGINE-S.txt``), with the
trace's host events and GPU kernels on one clock (``events-ENGINE-S.json``).

EAGLE heads (``--methods eagle,eagle3``) with dummy weights: a random
head of the target's shapes in vLLM's layout (`eagle_folder`). Random
weights rarely draft what the target says, so their rows time what a
head's step costs, not what it gains.

Writes ``spec-decode-bench.json``: per method and batch size the output
tok/s of both engines, the speedup, the acceptance rate and mean accepted
length (tokens emitted per drafted row: accepted drafts + 1); whether the
greedy tokens agree with plain decoding; and the verdict of the targets
(batch 1 at least TARGETS['batch1_speedup_min'] times plain decoding,
batch 64 no slower). With random weights how often drafts are accepted
depends on how the model repeats itself, so read each speedup together
with its acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

TARGETS = {"batch1_speedup_min": 1.8, "batch64_speedup_min": 1.0}
CALIBRATION_ROWS, CALIBRATION_TOKENS = 4, 128
METHODS = ("ngram", "draft_model", "eagle", "eagle3")
EAGLE3_DRAFT_VOCAB = 32000  # as the published EAGLE-3 heads for Llama 3


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Token-id prompts of ``length`` that repeat a random run of 16-64
    tokens (one run per prompt)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        run = [rng.randrange(100, vocab) for _ in range(rng.randrange(16, 65))]
        out.append((run * (length // len(run) + 1))[:length])
    return out


def draft_folder(ns) -> str:
    """A config folder for the draft: the target's with fewer layers."""
    path = os.path.join(ns.out, "draft-model")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(ns.model, "config.json")) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = ns.draft_layers
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def eagle_folder(ns, method: str) -> str:
    """A random-weight EAGLE head for the target (``method`` "eagle" or
    "eagle3"), in vLLM's checkpoint layout: the shapes a trained head has,
    so its steps cost what a trained one's do (its drafts are rarely
    accepted: random weights). EAGLE-3's draft vocabulary is
    EAGLE3_DRAFT_VOCAB ids of the target's, at random."""
    import numpy as np
    from safetensors.numpy import save_file
    path = os.path.join(ns.out, f"{method}-head")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(ns.model, "config.json")) as f:
        cfg = json.load(f)
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    N, K = cfg["num_attention_heads"], cfg.get("num_key_value_heads",
                                               cfg["num_attention_heads"])
    H = cfg.get("head_dim", D // N)
    rng = np.random.default_rng(ns.seed)

    def rand(*shape):
        return (rng.standard_normal(shape, np.float32) * 0.02).astype(
            np.float16)
    width = D if method == "eagle" else 2 * D  # q/k/v inputs
    layer = {"self_attn.q_proj.weight": rand(N * H, width),
             "self_attn.k_proj.weight": rand(K * H, width),
             "self_attn.v_proj.weight": rand(K * H, width),
             "self_attn.o_proj.weight": rand(D, N * H),
             "mlp.gate_proj.weight": rand(F, D),
             "mlp.up_proj.weight": rand(F, D),
             "mlp.down_proj.weight": rand(D, F),
             "post_attention_layernorm.weight": np.ones(D, np.float16)}
    n_layers, cfg["num_hidden_layers"] = cfg["num_hidden_layers"], 1
    if method == "eagle":
        out = {"layers.0." + k: v for k, v in layer.items()}
        out["fc.weight"] = rand(D, 2 * D)
    else:
        draft_vocab = min(EAGLE3_DRAFT_VOCAB, V)
        ids = np.sort(rng.choice(V, draft_vocab, replace=False))
        out = {"midlayer." + k: v for k, v in layer.items()}
        out.update({"midlayer.input_layernorm.weight": np.ones(D, np.float16),
                    "midlayer.hidden_norm.weight": np.ones(D, np.float16),
                    "fc.weight": rand(D, 3 * D),
                    "norm.weight": np.ones(D, np.float16),
                    "lm_head.weight": rand(draft_vocab, D),
                    "d2t": (ids - np.arange(draft_vocab)).astype(np.int64),
                    "t2d": np.isin(np.arange(V), ids)})
        L = n_layers
        # vLLM's default taps (2, L // 2, L - 3), kept inside small targets.
        cfg.update(architectures=["LlamaForCausalLMEagle3"],
                   draft_vocab_size=draft_vocab,
                   eagle_aux_hidden_state_layer_ids=[
                       min(2, L - 1), L // 2, max(L - 3, 0)])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(out, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    return path


def scale_later_layers(engine, first: int, factor: float, originals: dict):
    """The target's layers from ``first`` on: o_proj and down_proj set to
    ``factor`` times their drawn values (kept in ``originals``)."""
    import jax
    params = engine.runner.params
    for name in params:
        if not name.startswith("layers_") or int(name[7:]) < first:
            continue
        for block, proj in (("self_attn", "o_proj"), ("mlp", "down_proj")):
            key = (name, block, proj)
            leaf = params[name][block][proj]
            originals.setdefault(key, leaf)
            params[name][block][proj] = jax.tree_util.tree_map(
                lambda x: (x * factor).astype(x.dtype), originals[key])


def child(ns) -> dict:
    """One engine (speculative or plain) over every batch size."""
    from jaxinfer import LLM, SamplingParams
    spec = None
    if ns.child == "ngram":
        spec = {"method": "ngram",
                "num_speculative_tokens": ns.num_speculative_tokens,
                "prompt_lookup_max": ns.prompt_lookup_max,
                "prompt_lookup_min": ns.prompt_lookup_min}
    elif ns.child in ("eagle", "eagle3"):
        spec = {"method": ns.child,
                "num_speculative_tokens": ns.num_speculative_tokens,
                "model": (ns.eagle_head if ns.eagle_head is not None
                          else eagle_folder(ns, ns.child))}
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
    record: dict = {"engine": ns.child, "batches": {},
                    "speculative_config": spec}
    if ns.load_format == "dummy":
        originals: dict = {}
        scale = ns.agreement_scale
        if ns.child == "draft_model" and scale is None:
            scale, record["calibration"] = calibrate(llm, ns, vocab, originals)
        if scale is not None:
            scale_later_layers(engine, ns.draft_layers, scale, originals)
        record["later_layer_scale"] = scale
    for S in ns.batch_sizes:
        batch = [{"prompt_token_ids": p}
                 for p in prompts(S, ns.prompt_len, vocab, ns.seed + S)]
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


def run_child(ns, which: str, scale: float | None) -> dict:
    path = os.path.join(ns.out, f"{which}.part.json")
    argv = [sys.executable, os.path.abspath(__file__), "--child", which,
            "--out", ns.out]
    for key in ("model", "load_format", "tokenizer", "dtype", "max_model_len",
                "output_len", "prompt_len", "seed", "num_speculative_tokens",
                "prompt_lookup_max", "prompt_lookup_min", "draft_model",
                "eagle_head",
                "draft_layers", "agreement"):
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


def summarize(ns, base: dict, specs: dict[str, dict]) -> dict:
    import jax

    from benchmarks.run_stamp import run_stamp
    methods = {}
    for method, spec in specs.items():
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
            "calibration": spec.get("calibration"),
            "verdicts": verdicts, "batches": rows}
    return {"model": ns.model, "load_format": ns.load_format,
            "dtype": ns.dtype, "device": str(jax.devices()[0].device_kind),
            "workload": {"prompt_len": ns.prompt_len,
                         "output_len": ns.output_len,
                         "batch_sizes": ns.batch_sizes, "greedy": True},
            "target_later_layer_scale": base.get("later_layer_scale"),
            "draft_layers": ns.draft_layers,
            "targets": TARGETS, "methods": methods, **run_stamp()}


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
                   "eagle3 (real weights); with dummy weights a random "
                   "head of the target's shapes is written")
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--agreement", type=float, default=0.7)
    p.add_argument("--agreement-scales", default="0.02,0.05,0.1,0.2,0.3,0.5",
                   type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--agreement-scale", type=float, default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--engine", action="append", default=[],
                   metavar="KEY=VALUE", help="more engine arguments")
    p.add_argument("--child", choices=("plain",) + METHODS,
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
            p.error("--eagle-head with dummy weights: a random head of the "
                    "target's shapes is written; drop --eagle-head")
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
    if "draft_model" in ns.methods:  # first: it picks the target's scale
        specs["draft_model"] = run_child(ns, "draft_model", None)
        scale = specs["draft_model"].get("later_layer_scale")
    base = run_child(ns, "plain", scale)
    for method in ns.methods:
        if method not in specs:
            specs[method] = run_child(ns, method, scale)
    result = summarize(ns, base, {m: specs[m] for m in ns.methods})
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
