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


def _generate(ns: argparse.Namespace) -> int:
    from ..entrypoints.llm import LLM
    from ..sampling_params import SamplingParams
    llm = LLM.from_engine_args(engine_args_from(ns))
    sp = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature,
                        top_p=ns.top_p, top_k=ns.top_k, seed=ns.sampling_seed)
    prompts = ns.prompt or ["The capital of France is"]
    if ns.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], sp,
                        use_tqdm=False)
    else:
        outs = llm.generate(prompts, sp, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        print(f"Prompt: {prompt!r}\nOutput: {out.outputs[0].text!r}\n")
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


if __name__ == "__main__":
    sys.exit(main())
