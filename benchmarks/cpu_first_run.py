"""The first five minutes on a laptop CPU: jaxinfer beside HF transformers on
the embedded GGUF (SmolLM2-135M-Instruct), in one run.

    export PYTHONPATH=$PWD
    python benchmarks/cpu_first_run.py [--out benchmarks/results/cpu-first-run.json]

Measures, with fresh weight and compilation caches (cold) and again with the
caches the cold run left (warm):
- the README's first command, ``jaxinfer generate --prompt "The capital of
  France is" --max-tokens 32``, as a subprocess: wall time and time to the
  first streamed character;
- in one process: ``LLM()`` load, a first 32-token greedy generation
  (compiles, or loads from the cache), a second one, and 8 prompts x 64
  tokens in one batch, twice (the first compiles the batch's buckets).
Then HF transformers (torch, float32) on the same GGUF file and prompts:
load, the same two 32-token generations and the batched 8 x 64 twice (left
padding, one ``generate`` call). Rates compare the second runs. Every
generation runs to its full length (EOS ignored), so both sides produce the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_stamp import run_stamp

PROMPT = "The capital of France is"
BATCH_PROMPTS = [
    "The capital of France is", "Write a haiku about the sea:",
    "List three prime numbers:", "Once upon a time, in a small village,",
    "The best way to learn programming is", "Water boils at",
    "Explain photosynthesis in one sentence:", "My favourite colour is",
]
SINGLE, BATCH = 32, 64


def _cli_run(env) -> dict:
    """The README's first command; seconds to exit and to the first
    character of generated text on stdout."""
    cmd = [sys.executable, "-m", "jaxinfer.entrypoints.cli", "generate",
           "--prompt", PROMPT, "--max-tokens", str(SINGLE)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    seen, first = b"", None
    while True:
        ch = proc.stdout.read(1)
        if not ch:
            break
        seen += ch
        if first is None and b"Output: " in seen and not seen.endswith(
                b"Output: "):
            first = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed: {err}")
    return {"wall_s": round(wall, 2), "first_token_s": round(first or wall, 2),
            "stdout": seen.decode(), "stderr": err}


def _jaxinfer_in_process(env) -> dict:
    code = f"""
import json, time
t0 = time.perf_counter()
from jaxinfer import LLM, SamplingParams
llm = LLM()
t1 = time.perf_counter()
one = SamplingParams(max_tokens={SINGLE}, temperature=0, ignore_eos=True)
llm.generate([{PROMPT!r}], one, use_tqdm=False)
t2 = time.perf_counter()
out = llm.generate([{PROMPT!r}], one, use_tqdm=False)
t3 = time.perf_counter()
batch = SamplingParams(max_tokens={BATCH}, temperature=0, ignore_eos=True)
llm.generate({BATCH_PROMPTS!r}, batch, use_tqdm=False)
t4 = time.perf_counter()
outs = llm.generate({BATCH_PROMPTS!r}, batch, use_tqdm=False)
t5 = time.perf_counter()
print(json.dumps({{"load_s": t1 - t0, "first_32_s": t2 - t1,
                   "second_32_s": t3 - t2, "first_batch_8x64_s": t4 - t3,
                   "batch_8x64_s": t5 - t4,
                   "tokens": [len(o.outputs[0].token_ids) for o in outs],
                   "text": out[0].outputs[0].text}}))
"""
    res = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _hf(gguf_path: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(gguf_path)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32).eval()
    t1 = time.perf_counter()

    def run(prompts, n):
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        enc = tok(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
        return out[:, enc["input_ids"].shape[1]:]

    run([PROMPT], SINGLE)
    t2 = time.perf_counter()
    out = run([PROMPT], SINGLE)
    t3 = time.perf_counter()
    run(BATCH_PROMPTS, BATCH)
    t4 = time.perf_counter()
    run(BATCH_PROMPTS, BATCH)
    t5 = time.perf_counter()
    return {"load_s": t1 - t0, "first_32_s": t2 - t1, "second_32_s": t3 - t2,
            "first_batch_8x64_s": t4 - t3, "batch_8x64_s": t5 - t4,
            "text": tok.decode(out[0], skip_special_tokens=True),
            "torch_threads": torch.get_num_threads()}


def _rounded(d: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/cpu-first-run.json")
    args = ap.parse_args()
    from jaxinfer.models.embedded import DEFAULT_MODEL, embedded_model_path
    gguf_path = embedded_model_path(DEFAULT_MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ,
                   JAXINFER_WEIGHT_CACHE_DIR=os.path.join(tmp, "weights"),
                   JAXINFER_COMPILATION_CACHE_DIR=os.path.join(tmp, "xla"),
                   TRANSFORMERS_VERBOSITY="error")
        cli_cold = _cli_run(env)
        cli_warm = _cli_run(env)
        engine_warm = _rounded(_jaxinfer_in_process(env))
    hf = _rounded(_hf(gguf_path))
    single_j = SINGLE / engine_warm["second_32_s"]
    single_h = SINGLE / hf["second_32_s"]
    batch_j = len(BATCH_PROMPTS) * BATCH / engine_warm["batch_8x64_s"]
    batch_h = len(BATCH_PROMPTS) * BATCH / hf["batch_8x64_s"]
    result = {
        "what": "README first command and LLM() timings, jaxinfer vs HF "
                "transformers (torch, float32), embedded SmolLM2-135M GGUF",
        **run_stamp(),
        "command": "PYTHONPATH=$PWD python benchmarks/cpu_first_run.py",
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor()
                    or platform.machine(), "python": platform.python_version()},
        "cli_cold": {k: v for k, v in cli_cold.items() if k != "stderr"},
        "cli_warm": cli_warm,
        "jaxinfer_warm_caches": engine_warm,
        "hf_transformers": hf,
        "single_stream_tok_s": {"jaxinfer": round(single_j, 1),
                                "hf": round(single_h, 1),
                                "ratio": round(single_j / single_h, 2)},
        "batched_8x64_tok_s": {"jaxinfer": round(batch_j, 1),
                               "hf": round(batch_h, 1),
                               "ratio": round(batch_j / batch_h, 2)},
        "targets": {"cli_warm_wall_le_5s": cli_warm["wall_s"] <= 5.0,
                    "cli_warm_first_token_le_3s":
                        cli_warm["first_token_s"] <= 3.0,
                    "single_stream_ge_hf": single_j >= single_h,
                    "batched_ge_2x_hf": batch_j >= 2 * batch_h},
    }
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
