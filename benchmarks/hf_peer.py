"""The HF transformers peer of a throughput workload: the same model shape
with random weights and the same random prompts through transformers'
continuous batching (`generate_batch`, paged sdpa attention), greedy, every
output run to its length. Prints one JSON line (output tokens per second).
GPU machine, repo root (`engine_speed.py --peers` runs it):

    python3 benchmarks/hf_peer.py --num-prompts 256 --input-len 512 --output-len 256

BENCH_SMOKE=1 runs a tiny Llama on the CPU to check the script.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

SMOKE = os.environ.get("BENCH_SMOKE") == "1"


def prompts(seed: int, n: int, input_len: int, vocab: int) -> list[list[int]]:
    """The prompts engine_speed.py gives the same workload (same seed)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab, input_len).tolist() for _ in range(n)]


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="benchmarks/models/llama3-8b/config.json")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if SMOKE:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=256)
        device, dtype = "cpu", torch.float32
    else:
        with open(args.config) as f:
            cfg = LlamaConfig(**json.load(f))
        device, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            cfg, attn_implementation="paged|sdpa", dtype=dtype).eval()
    batch = prompts(args.seed, args.num_prompts, args.input_len, cfg.vocab_size)
    # eos -1: never stops early, as ignore_eos on the jaxinfer side.
    gen = GenerationConfig(max_new_tokens=args.output_len, do_sample=False,
                           eos_token_id=-1, pad_token_id=0)
    model.generate_batch(inputs=batch[:2], generation_config=gen)  # warm-up
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=batch, generation_config=gen)
    elapsed = time.perf_counter() - t0
    n_out = sum(len(v.generated_tokens) for v in out.values())
    print(json.dumps(dict(peer="transformers generate_batch (paged|sdpa)",
                          transformers=__import__("transformers").__version__,
                          num_prompts=len(batch), input_len=args.input_len,
                          output_len=args.output_len, elapsed_s=elapsed,
                          output_tokens=n_out,
                          output_tokens_per_s=n_out / elapsed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
