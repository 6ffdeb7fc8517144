"""Where a run's time goes: a step timeline (`--profile-steps`) against the
roofline of each of its steps, as a table and a PNG.

    python benchmarks/timeline_report.py DIR           # after engine_speed.py
    python benchmarks/timeline_report.py DIR --png     # also DIR/<run>.png (matplotlib)

Roofline of one step (docs/benchmarking.md, per step), two bounds:
``overlapped = max((W + kv_tokens * kv_bytes) / BW, MM + ATT)`` and
``serial = max(W / BW, MM) + max(kv_tokens * kv_bytes / BW, ATT)``, with
``MM = 2 * P * tokens / FLOPS_w`` and ``ATT = 4 * N * H * L * pairs / FLOPS``:
W the streamed weight bytes (all but an untied embedding table, in the
stored dtype), P the parameters a token passes through, ``kv_tokens`` the KV
entries the step reads (``kv_bytes`` per token in the page dtype), ``pairs``
its causal query-key pairs; BW, FLOPS (bf16) and, for fp8 weights, FLOPS_w
(fp8) measured in the same run. The overlapped bound is a step whose page
reads run beside its matmuls; the serial one runs the weights' products and
the attention one after the other, each at its own limit, which is what a
step of kernels on one stream can reach. A run's bounds are sums over its
steps; ``roofline_s`` and ``roofline_fraction`` are the overlapped ones.

For a mixture of experts, W counts the experts a step's T tokens touch: per
layer ``E * (1 - (1 - k/E)^T)``, the expected count under uniform routing
(every expert once T reaches a few hundred), and P the k experts a token
runs through. The constants come from the model's config
(``model_constants``; the run's ``summary.json`` names the model).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

# llama3-8b shape (benchmarks/models/llama3-8b/config.json), bf16: what
# model_constants gives for it, for summaries that name no model.
LLAMA3_8B = dict(streamed_weight_bytes=15.01e9, token_params=7.50e9,
                 kv_bytes_per_token=131072, attn_flops_per_pair=4 * 32 * 128 * 32)


def model_constants(model_dir: str, dtype_bytes: int = 2,
                    quantization: str | None = None,
                    kv_cache_dtype: str | None = None) -> dict:
    """step_t_min's constants for the model whose config.json is in
    ``model_dir``, counted on its abstract params (nothing allocated):
    parameter counts on the float model, weight bytes on the params as
    stored (``quantization``: the engine's argument; a checkpoint's own
    quantization_config counts too), KV bytes in ``kv_cache_dtype``."""
    import jax.numpy as jnp

    from jaxinfer.models.config import load_hf_config, model_config_from_hf
    from jaxinfer.models.loader import resolve_model
    cfg = model_config_from_hf(load_hf_config(model_dir))
    counts = _param_counts(cfg, lambda leaf: leaf.size)
    stored = resolve_model(model_dir, "dummy", quantization).config
    # Float params in the model's dtype (dtype_bytes); codes and their
    # scales as stored.
    sizes = _param_counts(stored, lambda leaf: leaf.size * (
        dtype_bytes if leaf.dtype == jnp.bfloat16 else leaf.dtype.itemsize))
    one_byte = (kv_cache_dtype or "auto").startswith("fp8")
    kv_dtype_bytes = 1 if one_byte else dtype_bytes
    L = cfg.num_layers
    dense, expert = counts["dense"], counts["expert"]
    out = dict(streamed_weight_bytes=sizes["dense"],
               token_params=dense,
               kv_bytes_per_token=2 * L * cfg.num_kv_heads * cfg.head_dim
               * kv_dtype_bytes,
               attn_flops_per_pair=4 * L * cfg.num_heads * cfg.head_dim)
    if stored.quantization is not None:
        out["quantization"] = stored.quantization.method
    E = getattr(cfg, "num_experts", 0)
    if expert and E:
        k = cfg.num_experts_per_tok
        per_expert = expert // (L * E)  # one expert's params in one layer
        out.update(num_layers=L, num_experts=E, experts_per_tok=k,
                   expert_bytes=sizes["expert"] // (L * E))
        out["token_params"] += L * k * per_expert
    return out


def _param_counts(cfg, measure) -> dict:
    """``measure(leaf)`` summed over the dense params (all but an untied
    embedding table and the stacked experts) and over the experts."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from jaxinfer.models.abstract import abstract_variables
    from jaxinfer.models.registry import model_class
    model = model_class(cfg.architecture)(cfg, dtype=jnp.bfloat16)
    params = nn.unbox(abstract_variables(model, cfg)["params"])
    expert, embedding, total = 0, 0, 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = [getattr(k, "key", "") for k in path]
        size = measure(leaf)
        if keys[-1] in ("gate_proj", "up_proj", "down_proj") and "mlp" in keys \
                and len(leaf.shape) == 3:  # stacked [E, ...] expert weights
            expert += size
        elif keys[0] == "embedding":
            embedding += size
        total += size
    tied = getattr(cfg, "tie_word_embeddings", False)
    return dict(dense=total - expert - (0 if tied else embedding),
                expert=expert)


def step_weight_bytes(m: dict, tokens: int) -> float:
    """The weight bytes a step of ``tokens`` tokens reads: the dense ones,
    plus for a mixture of experts the experts it is expected to touch."""
    w = m["streamed_weight_bytes"]
    if "num_experts" in m:
        E, k = m["num_experts"], m["experts_per_tok"]
        touched = E * (1.0 - (1.0 - k / E) ** tokens)
        w += m["num_layers"] * touched * m["expert_bytes"]
    return w


def step_bounds(r: dict, roof: dict, m: dict = LLAMA3_8B
                ) -> tuple[float, float]:
    """One record's (overlapped, serial) bounds in seconds; a multi-step
    window (``num_steps`` k) sums its k decode steps, each row's KV one
    token longer every step."""
    tokens = r["prefill_tokens"] + r["decode_tokens"]
    # fp8 weights multiply on the fp8 tensor cores (the run's fp8 rate);
    # every other scheme's products, and attention, run in 16 bits.
    flops_w = (roof.get("flops_fp8") or roof["flops"]
               if m.get("quantization") == "fp8" else roof["flops"])
    overlapped = serial = 0.0
    for i in range(r.get("num_steps", 1)):
        grown = i * r["decode_tokens"]  # decode rows gain a token per step
        w = step_weight_bytes(m, tokens) / roof["bw"]
        kv = (r["kv_tokens"] + grown) * m["kv_bytes_per_token"] / roof["bw"]
        mm = 2 * m["token_params"] * tokens / flops_w
        att = m["attn_flops_per_pair"] * (r["attn_pairs"] + grown) / roof["flops"]
        overlapped += max(w + kv, mm + att)
        serial += max(w, mm) + max(kv, att)
    return overlapped, serial


def step_t_min(r: dict, roof: dict, m: dict = LLAMA3_8B) -> float:
    """One record's overlapped bound (the roofline)."""
    return step_bounds(r, roof, m)[0]


def load_steps(path: str) -> list[dict]:
    """A timeline file, or its gzipped copy (``path + ".gz"``, as kept in
    benchmarks/results/)."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def kind(r: dict) -> str:
    if r["compiles"]:
        return "compile"
    return "decode" if r["decode_only"] else "mixed"


def summarize(steps: list[dict], roof: dict, elapsed_s: float | None,
              m: dict = LLAMA3_8B) -> dict:
    out = {"steps": len(steps)}
    bounds = [step_bounds(r, roof, m) for r in steps]
    t_min = sum(b[0] for b in bounds)
    t_serial = sum(b[1] for b in bounds)
    dev = sum(r["device_ms"] for r in steps) / 1e3
    out.update(roofline_s=t_min, serial_bound_s=t_serial, device_s=dev,
               host_s=sum(r["host_ms"] for r in steps) / 1e3,
               compile_s=sum(r["compile_ms"] for r in steps) / 1e3,
               preemptions=sum(r["preempted"] for r in steps))
    if elapsed_s:
        out.update(elapsed_s=elapsed_s, roofline_fraction=t_min / elapsed_s,
                   serial_fraction=t_serial / elapsed_s)
    by = {}
    for r, (over, ser) in zip(steps, bounds):
        k = kind(r)
        b = by.setdefault(k, {"n": 0, "device_s": 0.0, "t_min_s": 0.0,
                              "serial_s": 0.0, "host_s": 0.0})
        b["n"] += 1
        b["device_s"] += r["device_ms"] / 1e3
        b["host_s"] += r["host_ms"] / 1e3
        b["t_min_s"] += over
        b["serial_s"] += ser
    out["by_kind"] = by
    return out


def summarize_cut_off(steps: list[dict], roof: dict, m: dict = LLAMA3_8B) -> dict:
    """A workload stopped before its end (a device call's time limit): its
    timeline up to the last recorded step. ``elapsed_s`` runs from the
    timeline's start (the workload's) to that step's end; the tokens are the
    decode rows' (each prompt's first token, sampled by its last prefill
    chunk, is not counted), so ``decode_tokens_per_s`` is a lower bound of
    the output rate over that span."""
    if not steps:
        return {"steps": 0}
    last = steps[-1]
    elapsed = last["t_start_s"] + 1e-3 * (last["host_ms"] + last["device_ms"])
    out = summarize(steps, roof, elapsed, m)
    tokens = sum(r["decode_tokens"] * r.get("num_steps", 1) for r in steps)
    out.update(cut_off=True, decode_tokens=tokens,
               decode_tokens_per_s=tokens / elapsed,
               running_max=max(r["running"] for r in steps))
    return out


def table(name: str, s: dict) -> str:
    lines = [f"{name}: {s['steps']} steps, roofline {s['roofline_s']:.1f} s "
             f"(serial {s['serial_bound_s']:.1f} s)"
             + (f", wall {s['elapsed_s']:.1f} s, fraction "
                f"{s['roofline_fraction']:.2f} (of serial "
                f"{s['serial_fraction']:.2f})" if "elapsed_s" in s else "")
             + f"; device {s['device_s']:.1f} s, host {s['host_s']:.1f} s, "
             f"compile {s['compile_s']:.1f} s, preemptions {s['preemptions']}",
             f"  {'kind':8} {'steps':>6} {'device s':>9} {'roofline s':>10} "
             f"{'ratio':>6} {'serial':>6} {'host s':>7} {'ms/step':>8}"]
    for k, b in sorted(s["by_kind"].items()):
        dev = b["device_s"]
        ratio = b["t_min_s"] / dev if dev else 0.0
        serial = b["serial_s"] / dev if dev else 0.0
        lines.append(f"  {k:8} {b['n']:>6} {dev:>9.2f} "
                     f"{b['t_min_s']:>10.2f} {ratio:>6.2f} {serial:>6.2f} "
                     f"{b['host_s']:>7.2f} "
                     f"{1e3 * dev / max(b['n'], 1):>8.2f}")
    return "\n".join(lines)


def elapsed_of(bench: dict | None) -> float | None:
    if not bench:
        return None
    if "elapsed_s" in bench:
        return bench["elapsed_s"]
    if "latencies_s" in bench:
        return sum(bench["latencies_s"])
    return None


def report_dir(d: str, summary: dict | None = None, png: bool = False) -> str:
    if summary is None:
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
    roof = summary["roofline"]
    model = (summary.get("engine") or {}).get("model")
    engine = summary.get("engine") or {}
    m = (model_constants(model, quantization=engine.get("quantization"),
                         kv_cache_dtype=engine.get("kv_cache_dtype"))
         if model and os.path.exists(os.path.join(model, "config.json"))
         else LLAMA3_8B)
    summary["roofline_model"] = m
    fp8 = (f", fp8 {roof['flops_fp8'] / 1e12:.0f}" if roof.get("flops_fp8")
           else "")
    parts = [f"BW {roof['bw'] / 1e12:.2f} TB/s, matmul "
             f"{roof['flops'] / 1e12:.0f}{fp8} TFLOP/s ({roof.get('device', '')})"]
    for name, run in summary["runs"].items():
        path = os.path.join(d, f"{name}.steps.jsonl")
        if not (os.path.exists(path) or os.path.exists(path + ".gz")):
            parts.append(f"{name}: no timeline (rc={run.get('rc')})")
            continue
        steps = load_steps(path)
        s = summarize(steps, roof, elapsed_of(run.get("bench")), m)
        run["timeline"] = s
        parts.append(table(name, s))
        if png:
            plot(steps, roof, os.path.join(d, f"{name}.png"), name, m)
    # Timelines of workloads that did not finish (no bench record).
    for name in cut_off_names(d, summary):
        s = summarize_cut_off(load_steps(os.path.join(d, f"{name}.steps.jsonl")),
                              roof, m)
        summary.setdefault("cut_off", {})[name] = s
        parts.append(table(f"{name} (cut off)", s)
                     + f"\n  {s['decode_tokens']} decode tokens in "
                       f"{s['elapsed_s']:.1f} s: {s['decode_tokens_per_s']:.0f} tok/s")
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return "\n".join(parts)


def cut_off_names(d: str, summary: dict) -> list[str]:
    """Workloads with a timeline in ``d`` but no record in the summary."""
    names = []
    for f in sorted(os.listdir(d)):
        for ext in (".steps.jsonl", ".steps.jsonl.gz"):
            if f.endswith(ext) and f[:-len(ext)] not in summary.get("runs", {}):
                names.append(f[:-len(ext)])
    return names


def plot(steps: list[dict], roof: dict, path: str, title: str,
         m: dict = LLAMA3_8B) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colours = {"decode": "tab:blue", "mixed": "tab:orange", "compile": "tab:red"}
    fig, ax = plt.subplots(figsize=(10, 4))
    for k, c in colours.items():
        xs = [r["step"] for r in steps if kind(r) == k]
        ys = [r["device_ms"] for r in steps if kind(r) == k]
        if xs:
            ax.scatter(xs, ys, s=3, c=c, label=f"{k} (device)")
    ax.plot([r["step"] for r in steps],
            [1e3 * step_t_min(r, roof, m) for r in steps], "k-", lw=0.5,
            label="roofline of the step")
    ax.plot([r["step"] for r in steps], [r["host_ms"] for r in steps],
            c="tab:green", lw=0.5, label="host")
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(markerscale=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--png", action="store_true")
    a = ap.parse_args()
    print(report_dir(a.dir, png=a.png))
    sys.exit(0)
