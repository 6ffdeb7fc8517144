"""Gemma 2, Gemma 3 (text) and Phi-3 against HF transformers (torch, fp32).

For a tiny random-weight model of each (tests/tiny_models.py: Gemma's
with a sliding window of 8 tokens, shorter than most prompts, soft caps
low enough to matter and norm weights off their init; Phi-3's with
LongRoPE): greedy tokens of mixed-length prompts, run as one engine batch
with chunked prefill, equal HF's token for token, and again when the
prompts come back as prefix-cache hits; prefill logits agree within 1e-4;
and each family feature is load-bearing (the logits without it are far
from HF's). The same greedy tokens come out of a two-device
tensor-parallel engine (fake CPU devices).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from flax import linen as nn

from jaxinfer.models import RopeScaling, model_constants
from tests.models.forward import packed_prefill_logits
from tests.models.test_hf_parity import ENGINE, NUM_LOGPROBS, PROMPTS
from tests.runners import HfRunner, JaxInferRunner, check_logprobs_close, check_outputs_equal

MAX_TOKENS = 32
LOGITS_ATOL = 1e-4
LOGPROB_ATOL = 1e-4

# id -> (tiny_models arch, config overrides)
CASES = {
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3", {}),
    "phi3-longrope": ("phi3", {}),
}


@dataclasses.dataclass
class Pair:
    name: str
    hf: HfRunner
    ours: JaxInferRunner
    path: str


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tiny_model_factory, xla_cache):
    arch, overrides = CASES[request.param]
    path = tiny_model_factory(arch, **overrides)
    return Pair(request.param, HfRunner(path),
                JaxInferRunner(path, compilation_cache_dir=xla_cache, **ENGINE),
                path)


def test_weight_list_fills_the_module(tiny):
    from jaxinfer.models import model_spec
    from jaxinfer.models.abstract import abstract_variables
    from jaxinfer.models.spec import verify_weights
    runner = tiny.ours.engine.runner
    params = abstract_variables(runner.model, runner.cfg, every_layer=True)
    verify_weights(model_spec(runner.cfg.architecture), runner.cfg,
                   nn.unbox(params["params"]))


def _max_abs_diff(a_list, b_list):
    return max(float(np.abs(a - b).max()) for a, b in zip(a_list, b_list))


def test_greedy_equals_hf_with_chunks_and_prefix_hits(tiny):
    hf = tiny.hf.generate_greedy_logprobs(PROMPTS, MAX_TOKENS, NUM_LOGPROBS)
    assert sum(len(ids) for ids, _, _ in hf) >= MAX_TOKENS * len(PROMPTS) // 2
    first = tiny.ours.generate_greedy_logprobs(PROMPTS, MAX_TOKENS,
                                               NUM_LOGPROBS)
    check_logprobs_close(hf, first, "hf", "jaxinfer", logprob_atol=LOGPROB_ATOL)
    check_outputs_equal(hf, first, "hf", "jaxinfer")
    # The same prompts again: their full pages now come from the prefix
    # cache (sliding-window layers included), and the tokens must not move.
    outs = tiny.ours._generate(PROMPTS, max_tokens=MAX_TOKENS)
    assert sum(o.num_cached_tokens for o in outs) >= 128
    again = [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]
    check_outputs_equal(hf, again, "hf", "jaxinfer (prefix hits)")


def test_prefill_logits_match_hf(tiny):
    ids = [tiny.hf.encode(p) for p in PROMPTS]
    assert ids == [tiny.ours.tokenizer.encode(p) for p in PROMPTS]
    hf = tiny.hf.prefill_logits(ids)
    ours = tiny.ours.prefill_logits(ids)
    assert [o.shape for o in ours] == [h.shape for h in hf]
    assert _max_abs_diff(hf, ours) < LOGITS_ATOL
    # Each family feature changes the logits well beyond the tolerance
    # (RoPE variants least: a random model's attention is nearly uniform).
    cfg = tiny.ours.engine.runner.cfg
    assert cfg.sliding_window is None or cfg.sliding_window < max(
        len(i) for i in ids)
    for what, changed in _ablations(cfg):
        wrong = _logits_with(tiny, changed, ids)
        assert _max_abs_diff(hf, wrong) > 20 * LOGITS_ATOL, what


def _ablations(cfg):
    """(name, the config without one feature) for each feature the case's
    config turns on."""
    out = []
    if cfg.sliding_window is not None:
        out.append(("sliding window",
                    dataclasses.replace(cfg, sliding_window=None)))
    if getattr(cfg, "attn_logit_softcap", None) is not None:
        out.append(("attention soft cap",
                    dataclasses.replace(cfg, attn_logit_softcap=None)))
    if getattr(cfg, "final_logit_softcap", None) is not None:
        out.append(("final soft cap",
                    dataclasses.replace(cfg, final_logit_softcap=None)))
    if cfg.rope_scaling.rope_type != "default":
        out.append(("rope scaling", dataclasses.replace(
            cfg, rope_scaling=RopeScaling())))
    if hasattr(cfg, "query_pre_attn_scalar"):
        out.append(("query_pre_attn_scalar", dataclasses.replace(
            cfg, query_pre_attn_scalar=float(cfg.head_dim))))
    if getattr(cfg, "local_rope_theta", cfg.rope_theta) != cfg.rope_theta:
        out.append(("sliding layers' RoPE base", dataclasses.replace(
            cfg, local_rope_theta=cfg.rope_theta,
            local_rope_scaling=cfg.rope_scaling)))
    return out


def _logits_with(tiny, cfg, ids):
    runner = tiny.ours.engine.runner
    model = type(runner.model)(cfg, backend=runner.backend, dtype=runner.dtype)
    constants = model_constants(model, runner.scheduler_config.max_model_len)
    return packed_prefill_logits(model, runner.params, constants, ids,
                                 runner.block_size, runner.dtype)


# -- two devices ------------------------------------------------------------

_TP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from jaxinfer import LLM, SamplingParams
    path, backend, engine = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    prompts = json.loads(sys.stdin.read())
    llm = LLM(path, tensor_parallel_size=2, attention_backend=backend,
              **engine)
    sp = SamplingParams(max_tokens=int(sys.argv[4]), temperature=0)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    r = llm.llm_engine.runner
    print("RESULT" + json.dumps({
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "kv_spec": list(r.kv_pages[0][0].sharding.spec),
    }))
""")


def tensor_parallel_tokens(path, backend, prompts, max_tokens):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    engine = dict(ENGINE)
    proc = subprocess.run(
        [sys.executable, "-c", _TP_SCRIPT, path, backend, json.dumps(engine),
         str(max_tokens)], input=json.dumps(prompts), capture_output=True,
        text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.slow
@pytest.mark.parametrize("name,backend", [
    *((name, "reference") for name in CASES),
    # The Pallas kernels per shard, with a window and soft caps.
    ("gemma2", "pallas_interpret"),
])
def test_two_device_tensor_parallel_equals_hf(tiny_model_factory, name,
                                              backend):
    arch, overrides = CASES[name]
    path = tiny_model_factory(arch, **overrides)
    prompts = PROMPTS[-4:]  # the long ones: past the window, chunked
    hf = HfRunner(path).generate_greedy(prompts, MAX_TOKENS)
    res = tensor_parallel_tokens(path, backend, prompts, MAX_TOKENS)
    assert res["tokens"] == [ids for ids, _ in hf]
    assert res["kv_spec"] == ["model"]  # the 2 kv heads split over 2 devices


def test_phi3_long_factors_past_the_original_length(tiny_model_factory):
    """Serving past original_max_position_embeddings, LongRoPE takes its
    long factors. HF picks them from each forward's length; for one forward
    over a prompt of max_model_len tokens the two agree, and the short
    factors give other logits."""
    from jaxinfer.models import load_params, model_class, resolve_model
    path = tiny_model_factory("phi3", original_max_position_embeddings=64,
                              max_position_embeddings=512)
    hf = HfRunner(path)
    ids = hf.encode(PROMPTS[-1])
    assert len(ids) > 64
    files = resolve_model(path)
    cfg = files.config
    params = load_params(files, np.float32)
    model = model_class(cfg.architecture)(cfg)
    want = hf.prefill_logits([ids])
    got = packed_prefill_logits(model, params, model_constants(model, len(ids)),
                                [ids], 16, np.float32)
    assert _max_abs_diff(want, got) < LOGITS_ATOL
    short = packed_prefill_logits(model, params, model_constants(model, 64),
                                  [ids[:64]], 16, np.float32)
    assert _max_abs_diff(hf.prefill_logits([ids[:64]]), short) < LOGITS_ATOL
    assert _max_abs_diff([want[0][:64]], short) > 20 * LOGITS_ATOL


def test_phi3_fused_tensors_are_no_lora_targets(tiny_model_factory):
    """qkv_proj and gate_up_proj are cut into several layers at load, so
    an adapter of them has no one layer to wrap: they are not targets
    (an adapter naming them is refused); o_proj and down_proj are."""
    from jaxinfer.models import model_class, model_spec, resolve_model
    from jaxinfer.models.lora import lora_targets
    cfg = resolve_model(tiny_model_factory("phi3")).config
    names = {t.short_name for t in lora_targets(
        model_class(cfg.architecture)(cfg), cfg,
        model_spec(cfg.architecture)).values()}
    assert names == {"o_proj", "down_proj"}
