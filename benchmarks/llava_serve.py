"""Images in, text out at a llava-1.5-7b shape on one GPU: 64 concurrent
image + text requests through the engine in-process (as LLM.generate runs
them), random bf16 weights (``load_format="dummy"``), CLIP ViT-L/14 at
336 px, 576 image tokens each, distinct random images (no prefix hits).

From a plain checkout, on the GPU machine:

    export PYTHONPATH=$PWD; python3 benchmarks/llava_serve.py --out $OUT

(``--smoke``: a tiny random LLaVA and 4 requests, for CPU.) The model is
``benchmarks/models/llava-1.5-7b`` (config.json + preprocessor_config.json);
the tokenizer is a word-level one the script writes to a temp folder (the
prompts are token ids, so only the vocabulary size matters).

Measured, each a median over repeats after one warm-up run of the same
workload (which compiles the programs):

- ``output_tok_per_s``: generated tokens / wall time of a run (images
  preprocessed beforehand on the host; ``preprocess_s`` is that time).
- ``encoder_images_per_s``: the jitted encoder step alone (tower +
  projector + cache write) at each image batch size the engine uses.
- ``encoder_share``: in a run with host/device overlap off and each
  encoder call waited for, encoder seconds / (encoder + step seconds),
  and ``engine_images_per_s``, images over those encoder seconds.

Writes ``llava-serve-<device>.json``: commit, date, device, jax version,
params, raw repeats, medians; prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "models", "llava-1.5-7b")


def write_tokenizer(folder: str, vocab_size: int) -> str:
    """A word-level tokenizer over ``vocab_size`` ids (id i is "t{i}")."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0",
                                   bos_token="t1", eos_token="t2")
    fast.save_pretrained(folder)
    return folder


def tiny_model(folder: str) -> str:
    """--smoke: a tiny random LLaVA folder made by the tests' builder."""
    sys.path.insert(0, os.path.dirname(HERE))
    from tests.tiny_llava import make_tiny_llava
    return make_tiny_llava(folder)


def random_images(n: int, size: int, seed: int):
    import numpy as np
    from PIL import Image
    rng = np.random.RandomState(seed)
    return [Image.fromarray(rng.randint(0, 256, (size, size + 16 * (i % 3), 3),
                                        dtype=np.uint8)) for i in range(n)]


def make_prompts(cfg, n: int, text_len: int, seed: int):
    import numpy as np
    rng = np.random.RandomState(seed)
    image_token = cfg.image_input.token_id
    size = cfg.image_input.image_size
    prompts = []
    for img in random_images(n, size, seed):
        before = rng.randint(3, min(image_token, cfg.vocab_size), text_len // 2)
        after = rng.randint(3, min(image_token, cfg.vocab_size), text_len // 2)
        ids = [1, *before.tolist(), image_token, *after.tolist()]
        prompts.append({"prompt_token_ids": ids,
                        "multi_modal_data": {"image": img}})
    return prompts


def run_once(engine, prompts, params) -> dict:
    """Preprocesses, then runs every request to completion concurrently."""
    t0 = time.perf_counter()
    processed = [engine.input_processor.process(p, params) for p in prompts]
    t1 = time.perf_counter()
    runner = engine.runner
    enc = runner.encoder
    before = (enc.images_encoded, enc.encoder_calls, enc.encoder_seconds,
              runner.device_seconds, engine.num_steps)
    for p in processed:
        engine.add_request(None, p)
    n_out = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                n_out += len(out.outputs[0].token_ids)
    t2 = time.perf_counter()
    images, calls, enc_s, dev_s, steps = (
        enc.images_encoded - before[0], enc.encoder_calls - before[1],
        enc.encoder_seconds - before[2], runner.device_seconds - before[3],
        engine.num_steps - before[4])
    engine.reset_prefix_cache()
    return {"preprocess_s": t1 - t0, "wall_s": t2 - t1, "output_tokens": n_out,
            "output_tok_per_s": n_out / (t2 - t1), "images_encoded": images,
            "encoder_calls": calls, "steps": steps,
            "encoder_s": enc_s, "step_device_s": dev_s}


def encoder_flops(cfg) -> float:
    """Matmul FLOPs of encoding one image: the tower's layers up to the
    feature layer (projections, MLP, attention scores and values) and the
    projector."""
    v = cfg.vision
    tokens, D, F = v.num_patches + 1, v.hidden_size, v.intermediate_size
    layer = 2 * tokens * (4 * D * D + 2 * D * F) + 4 * tokens * tokens * D
    patches = 2 * v.num_patches * v.patch_dim * D
    d_in = D * len(cfg.feature_layers)
    projector = 2 * cfg.tokens_per_image * (d_in + cfg.hidden_size) * cfg.hidden_size
    return max(cfg.feature_layers) * layer + patches + projector


def encoder_alone(runner, repeats: int, flops_per_image: float) -> dict:
    """The jitted encoder step at each batch size the engine uses."""
    import jax
    import numpy as np
    enc = runner.encoder
    out = {}
    for B in enc.batch_sizes:
        pixels = np.random.RandomState(B).randn(B, *enc.pixel_shape).astype(
            np.float32)
        slots = np.arange(1, B + 1, dtype=np.int32)
        enc.cache = enc._encode(runner.params, enc.cache, pixels, slots)
        jax.block_until_ready(enc.cache)  # compiled (and warm)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            enc.cache = enc._encode(runner.params, enc.cache, pixels, slots)
            jax.block_until_ready(enc.cache)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        out[str(B)] = {"raw_s": times, "median_s": med, "images_per_s": B / med,
                       "tflop_per_s": B * flops_per_image / med / 1e12}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny random LLaVA, 4 requests (CPU)")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--text-len", type=int, default=40,
                    help="text tokens around each image")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attention-backend", default=None,
                    help="the engine's (default: pallas on GPU)")
    a = ap.parse_args()
    if a.smoke:
        a.num_requests, a.output_len, a.repeats = 4, 8, 2

    import jax

    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.llm_engine import LLMEngine
    from jaxinfer.sampling_params import SamplingParams

    tmp = tempfile.mkdtemp(prefix="llava-serve-")
    if a.smoke:
        model = tiny_model(os.path.join(tmp, "model"))
        kw = dict(model=model, dtype="float32", max_model_len=256,
                  max_num_seqs=4, max_num_batched_tokens=64)
    else:
        with open(os.path.join(MODEL, "config.json")) as f:
            vocab = json.load(f)["text_config"]["vocab_size"]
        kw = dict(model=MODEL, load_format="dummy", dtype="bfloat16",
                  tokenizer=write_tokenizer(os.path.join(tmp, "tok"), vocab),
                  max_model_len=1024, max_num_seqs=a.num_requests,
                  max_num_batched_tokens=2048)
    kw["attention_backend"] = a.attention_backend
    args = EngineArgs(**kw)
    t0 = time.perf_counter()
    engine = LLMEngine(args)
    load_s = time.perf_counter() - t0
    cfg = engine.model_config
    params = SamplingParams(temperature=0.0, max_tokens=a.output_len,
                            ignore_eos=True)
    t0 = time.perf_counter()
    run_once(engine, make_prompts(cfg, a.num_requests, a.text_len, 0), params)
    warmup_s = time.perf_counter() - t0  # compiles every program the run uses
    runs = [run_once(engine, make_prompts(cfg, a.num_requests, a.text_len, r),
                     params) for r in range(1, a.repeats + 1)]
    # The encoder's share: overlap off, each encoder call waited for.
    engine.args.async_scheduling = False
    engine.runner.encoder.sync_timing = True
    sync = run_once(engine, make_prompts(cfg, a.num_requests, a.text_len, 99),
                    params)
    engine.runner.encoder.sync_timing = False
    alone = encoder_alone(engine.runner, 5 if a.smoke else 10,
                          encoder_flops(cfg))

    def med(key, rs=runs):
        return statistics.median(r[key] for r in rs)

    share = sync["encoder_s"] / max(sync["encoder_s"] + sync["step_device_s"],
                                    1e-9)
    dev = jax.devices()[0]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    result = {
        "workload": "llava-serve", "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": dev.device_kind, "platform": dev.platform,
        "jax": jax.__version__,
        "params": {"model": "tiny (smoke)" if a.smoke else "llava-1.5-7b shape",
                   "num_requests": a.num_requests, "text_len": a.text_len,
                   "output_len": a.output_len, "repeats": a.repeats,
                   "tokens_per_image": cfg.image_input.tokens_per_image,
                   "image_size": cfg.image_input.image_size,
                   "num_params": cfg.num_params,
                   "engine": {k: v for k, v in kw.items() if k != "tokenizer"},
                   "encoder_batch_sizes": list(engine.runner.encoder.batch_sizes),
                   "encoder_gflop_per_image": encoder_flops(cfg) / 1e9},
        "load_s": load_s, "warmup_run_s": warmup_s,
        "runs": runs, "sync_run": sync, "encoder_alone": alone,
        "medians": {"output_tok_per_s": med("output_tok_per_s"),
                    "wall_s": med("wall_s"), "preprocess_s": med("preprocess_s"),
                    "encoder_share": share,
                    "engine_images_per_s": (sync["images_encoded"]
                                            / max(sync["encoder_s"], 1e-9)),
                    "encoder_images_per_s": {
                        b: v["images_per_s"] for b, v in alone.items()}},
    }
    os.makedirs(a.out, exist_ok=True)
    name = ("cpu" if dev.platform == "cpu"
            else dev.device_kind.split()[-1].lower())  # "NVIDIA H200" -> h200
    path = os.path.join(a.out, f"llava-serve-{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    m = result["medians"]
    print(f"\nwrote {path}")
    print(f"{'metric':34} value")
    print(f"{'output tok/s (median)':34} {m['output_tok_per_s']:.1f}")
    print(f"{'wall s per run (median)':34} {m['wall_s']:.2f}")
    print(f"{'host preprocess s per run':34} {m['preprocess_s']:.2f}")
    for b, v in alone.items():
        print(f"{'encoder images/s, batch ' + b:34} {v['images_per_s']:.1f} "
              f"({v['tflop_per_s']:.1f} TFLOP/s)")
    print(f"{'encoder images/s in the engine':34} {m['engine_images_per_s']:.1f}")
    print(f"{'encoder share of step time':34} {100 * m['encoder_share']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
