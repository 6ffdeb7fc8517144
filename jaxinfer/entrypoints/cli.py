"""The `jaxinfer` command: `generate`, `serve`, `bench`, `convert`."""

from __future__ import annotations

import argparse
import os
import sys


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """vLLM's engine flags, with vLLM's names."""
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="local HF folder, .gguf file, or embedded model name")
    p.add_argument("--tokenizer", default=None,
                   help="where the tokenizer comes from (default: the model)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights from the model's config.json")
    p.add_argument("--dtype", default="auto",
                   choices=["auto", "float32", "bfloat16", "float16", "half"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=True)
    p.add_argument("--swap-space", type=float, default=4.0)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    from jaxinfer.models.attention import BACKENDS
    p.add_argument("--attention-backend", default=None, choices=BACKENDS,
                   help="default: pallas on GPU (Mosaic GPU kernels on Hopper, "
                        "Triton elsewhere), reference on CPU; pallas_triton "
                        "keeps both kernels on the Triton lowering")


def engine_args_from(ns: argparse.Namespace):
    from ..config import EngineArgs
    return EngineArgs(
        model=ns.model, tokenizer=ns.tokenizer, load_format=ns.load_format,
        dtype=ns.dtype, seed=ns.seed,
        max_model_len=ns.max_model_len, block_size=ns.block_size,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enable_prefix_caching=ns.enable_prefix_caching,
        enable_chunked_prefill=ns.enable_chunked_prefill,
        swap_space=ns.swap_space, tensor_parallel_size=ns.tensor_parallel_size,
        attention_backend=ns.attention_backend)


def _generate(ns: argparse.Namespace) -> int:
    """Loads the model, then streams each prompt's tokens to stdout as they
    are sampled (as llama-cli does); what takes time (loading, compiling)
    is said on stderr."""
    import contextlib
    import time

    from ..entrypoints.llm import LLM
    from ..sampling_params import RequestOutputKind, SamplingParams
    from .progress import Status, show_engine_logs
    show_engine_logs()
    status = Status(sys.stderr)
    t0 = time.perf_counter()
    with status.running(f"loading {ns.model}"):
        llm = LLM.from_engine_args(engine_args_from(ns))
    status.say(f"loaded in {time.perf_counter() - t0:.1f}s")
    sp = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature,
                        top_p=ns.top_p, top_k=ns.top_k, seed=ns.sampling_seed,
                        output_kind=RequestOutputKind.DELTA)
    engine = llm.llm_engine
    for prompt in ns.prompt or ["The capital of France is"]:
        if ns.chat:
            ids = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=True,
                add_generation_prompt=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            request_id = engine.add_request(None, {"prompt_token_ids": ids}, sp)
        else:
            request_id = engine.add_request(None, prompt, sp)
        print(f"Prompt: {prompt!r}\nOutput: ", end="", flush=True)
        t1, first, n = time.perf_counter(), None, 0
        while engine.has_unfinished_requests():
            # The first step compiles (or loads from the compilation
            # cache); later ones stay quiet so the streamed text stays whole.
            with (status.running("compiling", after=1.0) if first is None
                  else contextlib.nullcontext()):
                outs = engine.step()
            for out in outs:
                if out.request_id != request_id:
                    continue
                piece = out.outputs[0]
                if piece.token_ids and first is None:
                    first = time.perf_counter() - t1
                n += len(piece.token_ids)
                print(piece.text, end="", flush=True)
        total = time.perf_counter() - t1
        print()
        rate = (n - 1) / (total - first) if n > 1 and total > first else 0.0
        status.say(f"{n} tokens in {total:.1f}s (first after {first or 0:.1f}s, "
                   f"then {rate:.1f} tok/s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxinfer",
                                     description="LLM inference in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text offline")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append",
                     help="a prompt (repeat for a batch)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true",
                     help="wrap each prompt in the chat template as a user turn")
    gen.set_defaults(func=_generate)
    from .openai.cli_args import add_serve_parser
    add_serve_parser(sub)
    from .bench import add_bench_parser
    add_bench_parser(sub)
    from .convert import add_convert_parser
    add_convert_parser(sub)
    return parser


def main(argv=None) -> int:
    # transformers warns at import that torch is absent; the CLI never needs
    # torch, so keep its output to the generated text and real errors.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except ValueError as e:  # bad input: say what to change, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
