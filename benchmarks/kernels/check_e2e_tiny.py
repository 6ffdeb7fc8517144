"""Greedy tokens of a tiny model through the Pallas kernels vs the reference.

    export PYTHONPATH=$PWD
    python3 benchmarks/kernels/check_e2e_tiny.py MODEL_DIR [pallas] [dtype]

Prompts of several lengths, with a small token budget so that long prompts are
prefilled in chunks (the kernel then reads the prefix from the pages) while
other sequences decode in the same steps. ``dtype`` (default: the model's)
picks the kernels on a Hopper GPU: bfloat16 runs the Mosaic GPU kernels,
float32 the Triton ones. Both sides run in that dtype. Sequences must agree
token for token, or diverge only at a near-tie (each side's token among the
other's top-5 logprobs, vLLM's ``check_logprobs_close``). Exits non-zero
otherwise.
"""

from __future__ import annotations

import sys

PROMPTS = ["Hello there, how are you doing today? " * 6, "x",
           "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"]


def greedy(path: str, backend: str, dtype: str, max_tokens: int = 12):
    from jaxinfer import LLM, SamplingParams
    llm = LLM(path, attention_backend=backend, dtype=dtype,
              num_gpu_blocks_override=96, max_model_len=256,
              max_num_batched_tokens=32, max_num_seqs=8, block_size=16)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                        ignore_eos=True, logprobs=5)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [{t: lp.logprob for t, lp in d.items()}
              for d in o.outputs[0].logprobs]) for o in outs]


def main():
    path = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "pallas"
    dtype = sys.argv[3] if len(sys.argv) > 3 else "auto"
    ref = greedy(path, "reference", dtype)
    got = greedy(path, backend, dtype)
    bad = 0
    for (r, rlp), (g, glp) in zip(ref, got):
        where = next((j for j, (a, b) in enumerate(zip(r, g)) if a != b), None)
        if where is None:
            print(f"OK   {r}")
            continue
        near_tie = r[where] in glp[where] and g[where] in rlp[where]
        bad += not near_tie
        print(f"{'TIE ' if near_tie else 'DIFF'} at token {where}: ref={r}\n"
              f"     {backend}={g}\n     ref top={rlp[where]}\n"
              f"     {backend} top={glp[where]}")
    if bad:
        sys.exit(1)
    print(f"e2e ({dtype}): {backend} greedy tokens equal the reference's "
          "(or diverge only at near-ties)")


if __name__ == "__main__":
    main()
