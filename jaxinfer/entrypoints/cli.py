"""The `jaxinfer` command: `generate`, `serve`, `bench`, `convert`."""

from __future__ import annotations

import argparse
import os
import sys


def _flag_type(annotation: str):
    """The argparse type of an EngineArgs annotation such as "int | None"."""
    base = [t.strip() for t in annotation.split("|") if t.strip() != "None"]
    return {"int": int, "float": float, "str": str, "bool": bool}[base[0]]


def add_engine_args(p: argparse.ArgumentParser, skip: tuple[str, ...] = (),
                    defaults: dict | None = None) -> None:
    """One flag per ``EngineArgs`` field, with vLLM's name (``--max-num-seqs``
    for ``max_num_seqs``), the field's default, type and help: a new field is
    a new flag, and no flag can drift from its field. ``skip``: fields the
    command sets itself; ``defaults``: the command's own defaults."""
    import dataclasses

    from ..config import EngineArgs
    for field in dataclasses.fields(EngineArgs):
        if field.name in skip:
            continue
        flag = "--" + field.name.replace("_", "-")
        meta = field.metadata
        names = (flag, *meta.get("aliases", ()))
        if not isinstance(field.type, str):  # config.py's postponed annotations
            raise TypeError(f"EngineArgs.{field.name}: annotation {field.type!r} "
                            "is not a string")
        kind = _flag_type(field.type)
        kwargs = {"dest": field.name,
                  "default": (defaults or {}).get(field.name, field.default),
                  "help": meta.get("help")}
        if kind is bool:
            p.add_argument(*names, action=argparse.BooleanOptionalAction,
                           **kwargs)
        else:
            p.add_argument(*names, type=kind, choices=meta.get("choices"),
                           metavar=meta.get("metavar"), **kwargs)


def engine_args_from(ns: argparse.Namespace, **overrides):
    """The EngineArgs the parsed engine flags name."""
    import dataclasses

    from ..config import EngineArgs
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)
              if hasattr(ns, f.name)}
    return EngineArgs(**{**values, **overrides})


def generate_engine_args(ns: argparse.Namespace):
    """`generate`'s EngineArgs. Its prompts run one at a time, so it asks
    for one sequence slot unless ``--max-num-seqs`` is given: the CPU KV
    pool is sized by slots (8 x max_model_len by default), and allocating
    and zeroing a pool eight times too large is a noticeable part of a
    start."""
    return engine_args_from(
        ns, **({"max_num_seqs": 1} if ns.max_num_seqs is None else {}))


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
        llm = LLM.from_engine_args(generate_engine_args(ns))
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
        rate = ((n - 1) / (total - first)
                if first is not None and n > 1 and total > first else 0.0)
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


def run_and_report(func, ns: argparse.Namespace) -> int:
    """Runs a command; bad input (a ValueError: unsupported flags, bad
    values) is printed without a traceback and exits 2."""
    # transformers warns at import that torch is absent; the CLI never needs
    # torch, so keep its output to the generated text and real errors.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        return func(ns)
    except ValueError as e:  # bad input: say what to change, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    ns = build_parser().parse_args(argv)
    return run_and_report(ns.func, ns)


def console_main() -> None:
    """The `jaxinfer` executable. After `generate` the process ends without
    the interpreter's teardown: freeing JAX's runtime and unloading modules
    is a sizeable share of a short warm run, and everything was already
    written (streams flushed, atexit handlers run, compiled
    programs saved when they were built). Other commands exit normally."""
    import atexit
    argv = sys.argv[1:]
    rc = main(argv)
    if argv[:1] == ["generate"]:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    console_main()
