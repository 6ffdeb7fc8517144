"""`jaxinfer convert`: any supported checkpoint -> a fast-loading orbax one.

    jaxinfer convert --model /path/hf-folder-or.gguf --output DIR --dtype bfloat16

DIR gets config.json (HF-style, its dtype set to the one chosen), the
tokenizer's files (GGUF vocabularies become a tokenizer.json) and params/
(orbax). `LLM(DIR)` and `jaxinfer serve DIR` then load it without any
per-tensor conversion.
"""

from __future__ import annotations

import json
import os
import time

_DTYPES = ("float32", "bfloat16", "float16", "half")


def convert(model: str, output: str, dtype: str = "auto") -> str:
    from jaxinfer.models import load_params, resolve_dtype, resolve_model
    from jaxinfer.models.orbax_checkpoint import save_params
    from ..tokenizer import load_tokenizer
    files = resolve_model(model)
    if files.format == "orbax":
        raise ValueError(f"{model} is already an orbax checkpoint")
    jdtype = resolve_dtype(dtype, files.config)
    if os.path.exists(output) and os.listdir(output):
        raise ValueError(f"output folder {output} is not empty: choose a new one")
    os.makedirs(output, exist_ok=True)
    params = load_params(files, jdtype)
    save_params(params, output)
    hf = dict(files.hf_config, torch_dtype=_dtype_name(jdtype))
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)
    load_tokenizer(files.tokenizer).save_pretrained(output)
    return output


def _dtype_name(jdtype) -> str:
    import jax.numpy as jnp
    return jnp.dtype(jdtype).name


def run_convert(ns) -> int:
    t0 = time.perf_counter()
    out = convert(ns.model, ns.output, ns.dtype)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    return 0


def add_convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="write a model as a fast-loading orbax checkpoint")
    p.add_argument("--model", required=True,
                   help="local HF folder, .gguf file, or embedded model name")
    p.add_argument("--output", required=True, help="a new (or empty) folder")
    p.add_argument("--dtype", default="auto", choices=("auto",) + _DTYPES)
    p.set_defaults(func=run_convert)
