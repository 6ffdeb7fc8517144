"""`lora-step` workload: the engine's decode step with
LoRA adapters against the same step without, and how long putting an
adapter into a device slot stalls the step loop.

One command (GPU machine, repo root):

    export PYTHONPATH=$PWD
    python3 benchmarks/lora_step.py --out $OUT

``--smoke`` runs tiny shapes on CPU (a minute) to check the script.

1. Correctness first (tiny model, float32, both products): a decode step
   whose rows use four adapters and the base model gives, row by row, the
   logits of the base model with that row's adapter merged into its
   weights (W + A B), and rows on slot 0 the base model's.
2. The llama3-8b shape (``benchmarks/models/llama3-8b/config.json``, random
   weights as ``--load-format dummy``, random KV pages), S=64 decode rows
   at L=1024, random rank-16 adapters on all seven projections, through
   the engine's own `ModelRunner` (packing, the jitted step with the
   sampler, the LoRA slot loads). Steps are dispatched back to back and
   collected one behind, as the engine overlaps them, so the time per step
   is the device's. Variants, each the median of repeats:
   - ``base``: an engine without LoRA;
   - ``lora_mixed``: 8 distinct adapters, 8 rows each (the product the engine
     picks for the shape: ``dense`` here);
   - ``lora_mixed_gather``: the same with the gathered per-row product forced;
   - ``slot0``: every row on slot 0 in the LoRA engine (it runs the step
     without LoRA work: ``worker/lora_inputs.py``);
   - ``slot0_pool``: every row on slot 0 with the LoRA pool passed anyway
     (what the skip saves).
   Targets: lora_mixed / base <= 1.25, slot0 / base <= 1.03.
3. Slot-load stall: the same loop where every other step brings a ninth
   adapter into the 8 slots (evicting one, then the evicted one comes
   back: one load per step), against the loop with no loads; the extra
   time per load in step units is the stall (target <= 1 step). No
   compile may happen during it.

Writes ``lora-step.json`` under ``--out`` (commit, date, device, versions,
parameters, raw repeats, medians, ratios, targets) and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.run_stamp import run_stamp
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.scheduler_output import NewRequestData, ScheduledRequest, SchedulerOutput
from jaxinfer.lora.config import LoRAConfig
from jaxinfer.lora.peft_format import LoRAAdapter
from jaxinfer.lora.request import LoRARequest
from jaxinfer.models import lora as model_lora
from jaxinfer.models import resolve_model
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.worker import model_runner as runner_module
from jaxinfer.worker import step_functions

BLOCK = 16
LLAMA3_8B = os.path.join(os.path.dirname(__file__), "models", "llama3-8b")
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 512, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_model_dir() -> str:
    path = tempfile.mkdtemp(prefix="lora-step-tiny-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_CONFIG, f)
    return path


def make_runner(model_dir, dtype, S, L, lora: LoRAConfig | None, backend):
    """The engine's runner over random weights and a random KV pool with
    room for S sequences of L tokens."""
    files = resolve_model(model_dir, "dummy")
    pages_per_seq = -(-L // BLOCK)
    sc = SchedulerConfig(max_model_len=L + BLOCK, max_num_seqs=S,
                         max_num_batched_tokens=max(S, 16))
    cc = CacheConfig(block_size=BLOCK, swap_space=0,
                     num_gpu_blocks_override=S * pages_per_seq + 1)
    runner = runner_module.ModelRunner(files, dtype, sc, cc, seed=0,
                                       attention_backend=backend,
                                       load_format="dummy", lora_config=lora)
    keys = jax.random.split(jax.random.key(1), 2 * len(runner.kv_pages))
    shape, sharding = runner.kv_pages[0][0].shape, runner.kv_pages[0][0].sharding
    rand = jax.jit(lambda k: jax.random.normal(k, shape, jnp.float32).astype(dtype),
                   out_shardings=sharding)
    runner.kv_pages = [(rand(keys[2 * i]), rand(keys[2 * i + 1]))
                       for i in range(len(runner.kv_pages))]
    return runner


def random_adapters(lora_inputs, n: int, rank: int, seed: int = 0):
    """n adapters of ``rank`` on every target layer, random in their slot
    layout (what `peft_format.load_peft_adapter` produces from a folder),
    held by the store as requests in flight hold theirs."""
    layout = lora_inputs.layout
    assert rank == layout.rank, "random adapters fill the whole slot"
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        flat = rng.standard_normal(layout.size, np.float32) * 0.05
        request = LoRARequest(f"bench-{i + 1}", i + 1, f"/bench/{i + 1}")
        adapter = LoRAAdapter(request, key=("bench", i + 1), rank=rank,
                              modules=tuple(layout.spans),
                              flat=lora_inputs.pool.stage(
                                  flat.astype(np.dtype(lora_inputs.pool.dtype))))
        lora_inputs.store.acquire(f"holder-{i + 1}", adapter)
        out.append(adapter)
    return out


class DecodeBatch:
    """S decode rows at L tokens: the SchedulerOutput of one step, for rows
    of groups of requests (one group per adapter, or None)."""

    def __init__(self, S: int, L: int, vocab: int):
        self.S, self.L = S, L
        rng = np.random.default_rng(0)
        pages = -(-L // BLOCK)
        self.tables = [list(1 + s * pages + np.arange(pages)) for s in range(S)]
        self.tokens = rng.integers(3, vocab, S).tolist()
        self.sent: set[str] = set()

    def step(self, loras: list) -> SchedulerOutput:
        """``loras[s]``: row s's LoRARequest (None: the base model)."""
        rows, new = [], []
        for s, lora in enumerate(loras):
            rid = f"row{s}-{lora.lora_int_id if lora else 0}"
            if rid not in self.sent:
                self.sent.add(rid)
                new.append(NewRequestData(rid, [self.tokens[s]], 1,
                                          SamplingParams(temperature=0.0),
                                          lora_request=lora))
            rows.append(ScheduledRequest(rid, [self.tokens[s]], self.L - 1,
                                         self.tables[s], True))
        return SchedulerOutput(rows, len(rows), [], [], [], [], new)


def run_loop(runner, outs: list[SchedulerOutput]) -> float:
    """Seconds for the steps, dispatched as the engine overlaps them: step
    N+1 enqueued before step N's tokens are read."""
    t = time.perf_counter()
    prev = None
    for out in outs:
        step = runner.dispatch(out)
        if prev is not None:
            runner.collect(prev)
        prev = step
    runner.collect(prev)
    return time.perf_counter() - t


def time_steps(runner, make_outs, steps: int, repeats: int) -> list[float]:
    """Per-step seconds of ``repeats`` loops of ``steps`` steps (after one
    warm-up loop, which compiles)."""
    run_loop(runner, make_outs(steps))
    return [run_loop(runner, make_outs(steps)) / steps for _ in range(repeats)]


def profile_loop(runner, make_outs, steps: int = 4) -> dict:
    """Kernel groups and the costliest kernels per step of ``steps``
    overlapped steps, under the JAX profiler."""
    from benchmarks.step_breakdown import summarize_trace
    with tempfile.TemporaryDirectory() as d:
        outs = make_outs(steps)
        jax.profiler.start_trace(d)
        run_loop(runner, outs)
        jax.profiler.stop_trace()
        return summarize_trace(d, steps)


@functools.cache
def _forced(method: str):
    def product(x, a, b, slots, _method=None):
        return _ORIGINAL_PRODUCT(x, a, b, slots, method)
    return product


_ORIGINAL_PRODUCT = model_lora.lora_product


def force_product(runner, method: str | None, compiler_options=None) -> None:
    """Makes the runner's forward program use one LoRA product (a fresh
    jit, so it is traced again with it), compiled with
    ``compiler_options``."""
    model_lora.lora_product = (_ORIGINAL_PRODUCT if method is None
                               else _forced(method))
    runner.programs._forward = jax.jit(
        functools.partial(step_functions.forward, runner.model,
                          logits_sharding=runner.placement.replicated),
        static_argnums=(0,), donate_argnums=(2,),
        compiler_options=compiler_options)
    runner.programs.built.clear()


# -- 1. correctness ----------------------------------------------------------

def check_correctness() -> dict:
    """LoRA rows against merged weights, on a tiny model in float32."""
    from jaxinfer.models.attention import AttentionMetadata
    from jaxinfer.models.runtime import run_model
    model_dir = tiny_model_dir()
    S, L, slots = 8, 64, 4
    runner = make_runner(model_dir, jnp.float32, S, L,
                         LoRAConfig(max_loras=slots, max_lora_rank=8),
                         "reference")
    lora = runner.lora
    adapters = random_adapters(lora, slots, rank=8, seed=3)
    for slot, adapter in enumerate(adapters, start=1):
        lora.pool.write(slot, adapter)
    row_slots = np.array([0, 1, 2, 3, 4, 1, 0, 2], np.int32)
    pages = L // BLOCK
    tables = (1 + np.arange(S * pages, dtype=np.int32)).reshape(S, pages)
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(tables[:, -1] * BLOCK + (L - 1) % BLOCK),
        block_tables=jnp.asarray(tables), kv_lens=jnp.full(S, L, jnp.int32),
        cu_q_lens=jnp.arange(S + 1, dtype=jnp.int32),
        num_seqs=jnp.array([S], jnp.int32), decode_only=True)
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 512, S), jnp.int32)
    pos = jnp.full(S, L - 1, jnp.int32)

    def logits(params, with_lora, method=None):
        model_lora.lora_product = (_ORIGINAL_PRODUCT if method is None
                                   else _forced(method))
        try:
            out, _ = run_model(
                runner.model, params, runner.constants, runner.kv_pages, ids,
                pos, md, jnp.arange(S, dtype=jnp.int32),
                lora=(lora.pool.arrays, jnp.asarray(row_slots))
                if with_lora else None)
        finally:
            model_lora.lora_product = _ORIGINAL_PRODUCT
        return np.asarray(out)

    def merged(slot):
        params = jax.tree_util.tree_map(lambda x: x, runner.params)
        for t in lora.layout.targets.values():
            node = params
            for key in t.path:
                node = node[key]
            pool = lora.pool.arrays
            for key in t.path:
                pool = pool[key]
            a = pool[model_lora.LORA_A][..., slot - 1, :]  # in_shape + (r,)
            b = pool[model_lora.LORA_B][slot - 1]  # (r,) + out_shape
            n_in = len(t.in_shape)
            node["kernel"] = node["kernel"] + jnp.tensordot(a, b, axes=([n_in], [0]))
        return params

    base = logits(runner.params, False)
    errors = {}
    for method in ("dense", "gather"):
        got = logits(runner.params, True, method)
        worst = float(np.abs(got[row_slots == 0] - base[row_slots == 0]).max())
        for slot in range(1, slots + 1):
            want = logits(merged(slot), False)
            rows = row_slots == slot
            worst = max(worst, float(np.abs(got[rows] - want[rows]).max()))
        errors[method] = worst
    effect = float(np.abs(logits(runner.params, True) - base).max())
    ok = all(e < 1e-3 for e in errors.values()) and effect > 100 * max(errors.values())
    return dict(max_abs_error=errors, lora_effect=effect, ok=ok)


# -- 2 and 3. timing -----------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on CPU, to check the script")
    ap.add_argument("--S", type=int, default=64)
    ap.add_argument("--L", type=int, default=1024)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true",
                    help="also the GPU kernels of a few base and lora_mixed "
                         "steps by group and name (step_breakdown.py's "
                         "summary of a JAX profiler trace)")
    args = ap.parse_args()
    profiles = {}
    if args.smoke:
        args.S, args.L, args.steps, args.repeats = 16, 64, 6, 3
    correctness = check_correctness()
    print(f"correctness: {correctness}", flush=True)
    if not correctness["ok"]:
        raise SystemExit("LoRA logits differ from the merged-weight reference")

    S, L, n = args.S, args.L, args.adapters
    model_dir = tiny_model_dir() if args.smoke else LLAMA3_8B
    dtype = jnp.float32 if args.smoke else jnp.bfloat16
    backend = "reference" if args.smoke else None
    vocab = resolve_model(model_dir, "dummy").config.vocab_size
    per_group = S // n
    batch = DecodeBatch(S, L, vocab)

    def same(loras):
        return lambda steps: [batch.step(loras) for _ in range(steps)]

    # Without LoRA: its own engine (no pool), then freed.
    runner = make_runner(model_dir, dtype, S, L, None, backend)
    raw = {"base": time_steps(runner, same([None] * S), args.steps, args.repeats)}
    if args.profile:
        profiles["base"] = profile_loop(runner, same([None] * S))
    del runner
    gc.collect()
    batch = DecodeBatch(S, L, vocab)  # its requests are new to this runner
    runner = make_runner(model_dir, dtype, S, L,
                         LoRAConfig(max_loras=n, max_lora_rank=args.rank),
                         backend)
    adapters = random_adapters(runner.lora, n + 1, args.rank)
    reqs = [a.request for a in adapters]
    mixed = [reqs[s // per_group] for s in range(S)]  # groups of 8 rows
    raw["lora_mixed"] = time_steps(runner, same(mixed), args.steps, args.repeats)
    if runner.lora.num_slot_loads < n:  # the rows really ran their adapters
        raise SystemExit(f"{runner.lora.num_slot_loads} slot loads for {n} "
                         "adapters: the mixed steps did not use LoRA")
    if args.profile:
        profiles["lora_mixed"] = profile_loop(runner, same(mixed))
    raw["slot0"] = time_steps(runner, same([None] * S), args.steps, args.repeats)

    # Every other step swaps adapter n for adapter n+1 (one slot load per
    # step), against the plain mixed loop just measured.
    swapped = mixed[:S - per_group] + [reqs[n]] * per_group

    def alternating(steps):
        return [batch.step(swapped if i % 2 == 0 else mixed)
                for i in range(steps)]
    compiles = []

    def listener(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)
    run_loop(runner, alternating(2))  # the slot writer compiles here
    loads_before = runner.lora.num_slot_loads
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        raw["lora_mixed_loading"] = [run_loop(runner, alternating(args.steps)) / args.steps
                                for _ in range(args.repeats)]
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    loads = (runner.lora.num_slot_loads - loads_before) / (args.repeats * args.steps)

    # The skip's worth: slot 0 everywhere, pool passed anyway.
    original = runner.lora.token_slots
    runner.lora.token_slots = lambda sched, reqs_, T: np.zeros(T, np.int32)
    raw["slot0_pool"] = time_steps(runner, same([None] * S), args.steps,
                                   args.repeats)
    runner.lora.token_slots = original
    force_product(runner, "gather")
    raw["lora_mixed_gather"] = time_steps(runner, same(mixed), args.steps,
                                     args.repeats)
    # XLA's dot_merger joins the shrinks of q/k/v (and of gate/up), which
    # share their input, into one dot over their A's concatenated at run
    # time: the same step without that pass.
    force_product(runner, None, {"xla_disable_hlo_passes": "dot-merger"})
    raw["lora_mixed_nomerge"] = time_steps(runner, same(mixed), args.steps,
                                           args.repeats)
    if args.profile:
        profiles["lora_mixed_nomerge"] = profile_loop(runner, same(mixed))
    force_product(runner, None)

    med = {k: statistics.median(v) for k, v in raw.items()}
    step = med["lora_mixed"]
    stall_steps = (med["lora_mixed_loading"] - step) / step / max(loads, 1e-9)
    ratios = {k: med[k] / med["base"] for k in med}
    targets = {
        "lora_mixed_over_base<=1.25": ratios["lora_mixed"] <= 1.25,
        "slot0_over_base<=1.03": ratios["slot0"] <= 1.03,
        "stall_per_load_steps<=1": stall_steps <= 1.0,
        "no_compile_while_loading": not compiles,
    }
    roof = {}
    if not args.smoke:
        from benchmarks.kernels.bench_attention import roofline
        roof = roofline()
    result = dict(
        workload="lora-step", model="tiny" if args.smoke else "llama3-8b",
        **run_stamp(),
        device=str(jax.devices()[0].device_kind), jax=jax.__version__,
        jaxlib=__import__("jaxlib").__version__,
        params=dict(S=S, L=L, rank=args.rank, adapters=n, rows_per_adapter=per_group,
                    steps_per_repeat=args.steps, repeats=args.repeats,
                    dtype=str(jnp.dtype(dtype)),
                    pool_bytes=runner.lora.pool.nbytes,
                    slot_bytes=runner.lora.layout.size * jnp.dtype(dtype).itemsize),
        correctness=correctness, raw_step_s=raw, median_step_s=med,
        ratios_to_base=ratios, slot_loads_per_step=loads,
        stall_per_load_steps=stall_steps, compiles_while_loading=len(compiles),
        targets=targets, profiles=profiles,
        roofline={k: v for k, v in roof.items() if k in ("bw", "flops", "device")},
        command="python3 benchmarks/lora_step.py --out $OUT"
                + (" --smoke" if args.smoke else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lora-step.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"S={S} L={L} rank={args.rank} adapters={n} on {result['device']}")
    print(f"{'variant':<19} {'ms/step':>9} {'x base':>7}")
    for k in ("base", "lora_mixed", "lora_mixed_gather", "lora_mixed_nomerge",
              "slot0", "slot0_pool", "lora_mixed_loading"):
        print(f"{k:<19} {med[k] * 1e3:>9.3f} {ratios[k]:>7.3f}")
    print(f"stall per slot load: {stall_steps:.2f} steps "
          f"({loads:.2f} loads/step), compiles while loading: {len(compiles)}")
    for k, prof in profiles.items():
        print(f"profile {k}: {prof.get('kernels', 0):.0f} kernels/step, busy "
              f"{prof.get('busy_ms', 0):.2f} ms, groups "
              + ", ".join(f"{g} {v['ms']:.2f} ms ({v['n']:.0f})"
                          for g, v in prof.get("groups", {}).items()))
        for t in prof.get("top", [])[:12]:
            print(f"    {t['ms']:7.3f} ms {t['n']:5.0f}x  {t['name'][:90]}")
    print("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                  for k, v in targets.items()))


if __name__ == "__main__":
    main()
