"""`jaxinfer convert`: any supported checkpoint -> a fast-loading orbax one.

    jaxinfer convert MODEL --output DIR [--dtype bfloat16] [--quantization fp8]

MODEL (or --model) is a local HF folder, a .gguf file or an embedded name.
DIR gets config.json (HF-style, its dtype set to the one chosen; with
quantization, a ``quantization_config`` naming our own param layout), the
tokenizer's files (GGUF vocabularies become a tokenizer.json) and params/
(orbax). `LLM(DIR)` and `jaxinfer serve DIR` then load it without any
per-tensor conversion: quantized params (int8 / fp8 codes and scales, AWQ /
GPTQ / GGUF groups) are restored as they were written, straight into their
shards.
"""

from __future__ import annotations

import json
import os
import time

_DTYPES = ("float32", "bfloat16", "float16", "half")


def convert(model: str, output: str, dtype: str = "auto",
            quantization: str | None = None) -> str:
    """``quantization``: as ``LLM``'s (int8 / fp8 quantize a float
    checkpoint; awq / gptq / fp8 / gguf keep a quantized one's method;
    None: the checkpoint's own quantization, if any)."""
    from jaxinfer.models import load_params, resolve_dtype, resolve_model
    from jaxinfer.models.orbax_checkpoint import save_params

    from ..config import check_quantization
    from ..tokenizer import load_tokenizer
    if quantization is not None:
        check_quantization("--quantization", quantization)
    files = resolve_model(model, quantization=quantization)
    if files.format == "orbax":
        raise ValueError(f"{model} is already an orbax checkpoint")
    jdtype = resolve_dtype(dtype, files.config)
    if os.path.exists(output) and os.listdir(output):
        raise ValueError(f"output folder {output} is not empty: choose a new one")
    os.makedirs(output, exist_ok=True)
    params = load_params(files, jdtype)
    save_params(params, output)
    hf = dict(files.hf_config, torch_dtype=_dtype_name(jdtype))
    hf.pop("quantization_config", None)  # the checkpoint's own layout
    if files.config.quantization is not None:
        hf["quantization_config"] = files.config.quantization.to_json()
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)
    load_tokenizer(files.tokenizer).save_pretrained(output)
    return output


def _dtype_name(jdtype) -> str:
    import jax.numpy as jnp
    return jnp.dtype(jdtype).name


def run_convert(ns) -> int:
    t0 = time.perf_counter()
    model = ns.model_tag or ns.model
    if model is None or (ns.model_tag and ns.model and ns.model_tag != ns.model):
        raise ValueError("convert: give the model once, as MODEL or --model")
    out = convert(model, ns.output, ns.dtype, ns.quantization)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    return 0


def add_convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="write a model as a fast-loading orbax checkpoint")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="local HF folder, .gguf file, or embedded model name")
    p.add_argument("--model", default=None, help="the same as MODEL")
    p.add_argument("--output", required=True, help="a new (or empty) folder")
    p.add_argument("--dtype", default="auto", choices=("auto",) + _DTYPES)
    p.add_argument("--quantization", "-q", default=None,
                   help="quantize while converting (int8, fp8), or keep a "
                   "quantized checkpoint's method (awq, gptq, fp8, gguf); "
                   "default: the checkpoint's own quantization, if any")
    p.set_defaults(func=run_convert)
