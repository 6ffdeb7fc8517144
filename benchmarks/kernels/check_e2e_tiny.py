"""Greedy tokens of a tiny model through the Pallas kernels vs the reference.

    R=$PWD; export PYTHONPATH=$(bash benchmarks/package_layout.sh); cd $PYTHONPATH
    python3 benchmarks/kernels/check_e2e_tiny.py $R/MODEL_DIR [pallas]

Prompts of several lengths, with a small token budget so that long prompts are
prefilled in chunks (the kernel then reads the prefix from the pages) while
other sequences decode in the same steps. Exits non-zero on a mismatch.
"""

from __future__ import annotations

import sys

PROMPTS = ["Hello there, how are you doing today? " * 6, "x",
           "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"]


def greedy_tokens(path: str, backend: str, max_tokens: int = 12) -> list:
    from jaxinfer import LLM, SamplingParams
    llm = LLM(path, attention_backend=backend, num_gpu_blocks_override=96,
              max_model_len=256, max_num_batched_tokens=32, max_num_seqs=8,
              block_size=16)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def main():
    path = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "pallas"
    ref = greedy_tokens(path, "reference")
    got = greedy_tokens(path, backend)
    for r, g in zip(ref, got):
        print(("OK  " if r == g else "DIFF") + f" ref={r}\n     {backend}={g}")
    if ref != got:
        sys.exit(1)
    print(f"e2e: {backend} greedy tokens equal the reference's")


if __name__ == "__main__":
    main()
