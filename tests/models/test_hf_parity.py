"""The engine against Hugging Face transformers (torch, float32).

For the embedded model and a tiny random-weight model of every supported
variant: greedy continuations of 8 mixed-length prompts, run as ONE engine
batch (chunked prefill mixed with decodes), equal HF's token for token (the
embedded model may diverge only at near-ties, see ``check_logprobs_close``);
the chosen tokens' logprobs agree; and the logits at every prompt position,
from a direct call of the model forward, agree within 1e-3.

Tiny models have peaked random weights (std 0.08, tests/tiny_models.py) so
that greedy never meets a near-tie and exact equality is the right bar.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import model_constants
from tests.models.forward import packed_prefill_logits
from tests.runners import HfRunner, JaxInferRunner, check_logprobs_close, check_outputs_equal

# One xdist worker (with --dist loadgroup) builds the shared HF reference of
# the embedded model and the module's engines once.
pytestmark = pytest.mark.xdist_group("hf_embedded")

MAX_TOKENS = 32
NUM_LOGPROBS = 5
LOGITS_ATOL = 1e-3  # float32
LOGPROB_ATOL = 1e-3

_LONG = ("The river starts high in the mountains, where snow melts every "
         "spring and runs down through pine forests into a narrow valley. "
         "Farmers there grow apples, barley and potatoes, and they sell them "
         "at a market in the old town square each Saturday morning. ") * 3

# Mixed lengths, 1 to ~150 tokens: prompt + output runs past the tiny
# llama3 (64) and yarn (128) original_max_position_embeddings and past the
# Mistral sliding window (8).
PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "x",
    "One two three four five six seven eight nine ten eleven twelve",
    "Why is the sky blue? Explain it like I am five years old, please.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "In 1492, Columbus sailed the ocean blue. " * 5,
    _LONG,
]

# One engine step holds at most 64 tokens, so the ~270 prompt tokens are
# prefilled in chunks while earlier prompts already decode.
ENGINE = dict(dtype="float32", max_model_len=256, max_num_seqs=8,
              max_num_batched_tokens=64, block_size=16,
              num_gpu_blocks_override=160)

# id -> (arch, rope, config overrides). Tied embeddings: qwen2 (as the small
# Qwen2 checkpoints); the others are untied.
CASES = {
    "llama": ("llama", "default", {}),
    "llama-linear": ("llama", "linear", {}),
    # Within max_position_embeddings HF's dynamic NTK leaves the frequencies
    # unscaled, and so do we (rope.py): greedy parity here only shows that;
    # test_dynamic_rope_past_max_position_embeddings exercises the scaling.
    "llama-dynamic": ("llama", "dynamic", {}),
    "llama-llama3": ("llama", "llama3", {}),
    "llama-yarn": ("llama", "yarn", {}),
    "mistral-window8": ("mistral", "default", {}),
    "qwen2-bias-tied": ("qwen2", "default", {"tie_word_embeddings": True}),
    "qwen3-qknorm": ("qwen3", "default", {}),
}


@dataclasses.dataclass
class Pair:
    name: str
    hf: HfRunner
    ours: JaxInferRunner
    path: str


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    """One persistent compilation cache for the module: tiny models of one
    architecture share their step programs (the rope table is an input)."""
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tiny_model_factory, xla_cache):
    arch, rope, overrides = CASES[request.param]
    path = tiny_model_factory(arch, rope, **overrides)
    return Pair(request.param, HfRunner(path),
                JaxInferRunner(path, compilation_cache_dir=xla_cache, **ENGINE),
                path)


def _max_abs_diff(a_list, b_list):
    return max(float(np.abs(a - b).max()) for a, b in zip(a_list, b_list))


def test_tiny_greedy_equals_hf(tiny):
    ours = tiny.ours.generate_greedy_logprobs(PROMPTS, MAX_TOKENS, NUM_LOGPROBS)
    hf = tiny.hf.generate_greedy_logprobs(PROMPTS, MAX_TOKENS, NUM_LOGPROBS)
    # Enough tokens to compare (EOS may end a random model's sequence early).
    assert sum(len(ids) for ids, _, _ in hf) >= MAX_TOKENS * len(PROMPTS) // 2
    check_logprobs_close(hf, ours, "hf", "jaxinfer", logprob_atol=LOGPROB_ATOL)
    check_outputs_equal(hf, ours, "hf", "jaxinfer")
    if tiny.name == "llama":
        # The plain greedy path (no logprobs variant) gives the same tokens
        # (checked once: it costs one more compile).
        check_outputs_equal(hf, tiny.ours.generate_greedy(PROMPTS, MAX_TOKENS),
                            "hf", "jaxinfer")


def test_tiny_prefill_logits_match_hf(tiny):
    ids = [tiny.hf.encode(p) for p in PROMPTS]
    assert ids == [tiny.ours.tokenizer.encode(p) for p in PROMPTS]
    hf = tiny.hf.prefill_logits(ids)
    ours = tiny.ours.prefill_logits(ids)
    assert [o.shape for o in ours] == [h.shape for h in hf]
    assert _max_abs_diff(hf, ours) < LOGITS_ATOL
    # The comparison would notice a missing rope scaling or sliding window:
    # without them our logits are far from HF's.
    wrong = _without_scaling_or_window(tiny, ids)
    if wrong is not None:
        assert _max_abs_diff(hf, wrong) > 100 * LOGITS_ATOL


def _without_scaling_or_window(tiny, ids):
    """Our prefill logits with unscaled rope (or no sliding window); None
    when the case has neither (dynamic is unscaled below max positions)."""
    runner = tiny.ours.engine.runner
    cfg = runner.cfg
    model, constants = runner.model, runner.constants
    if cfg.rope_scaling.rope_type not in ("default", "dynamic"):
        unscaled = model.clone(cfg=dataclasses.replace(
            cfg, rope_scaling=type(cfg.rope_scaling)()))
        constants = model_constants(unscaled,
                                    runner.scheduler_config.max_model_len)
    elif cfg.sliding_window is not None:
        assert cfg.sliding_window < max(len(i) for i in ids)
        model = type(runner.model)(dataclasses.replace(cfg, sliding_window=None),
                                   backend=runner.backend, dtype=runner.dtype)
    else:
        return None
    return packed_prefill_logits(model, runner.params, constants, ids,
                                 runner.block_size, runner.dtype)


def test_dynamic_rope_past_max_position_embeddings(tiny_model_factory):
    """Dynamic NTK scaling: HF rescales the base from the current length
    once it passes max_position_embeddings (and would change keys already
    cached); we fix the base at the engine's max_model_len. For one forward
    over a prompt of exactly max_model_len tokens the two are the same
    formula, so logits must agree, and differ from unscaled rope."""
    path = tiny_model_factory("llama", "dynamic", max_position_embeddings=64)
    hf = HfRunner(path)
    ids = hf.encode(_LONG)
    assert len(ids) > 64
    from jaxinfer.models import load_params, model_class, resolve_model
    files = resolve_model(path)
    cfg = files.config
    params = load_params(files, jnp.float32)
    model = model_class(cfg.architecture)(cfg)
    scaled = model_constants(model, len(ids))
    plain = model_constants(model.clone(cfg=dataclasses.replace(
        cfg, rope_scaling=type(cfg.rope_scaling)())), len(ids))
    want = hf.prefill_logits([ids])
    got = packed_prefill_logits(model, params, scaled, [ids], 16, jnp.float32)
    assert _max_abs_diff(want, got) < LOGITS_ATOL
    unscaled = packed_prefill_logits(model, params, plain, [ids], 16,
                                     jnp.float32)
    assert _max_abs_diff(want, unscaled) > 100 * LOGITS_ATOL


# -- the embedded model (SmolLM2-135M-Instruct, Q4_1 GGUF) -----------------

@pytest.fixture(scope="module")
def embedded_engine(xla_cache):
    # The whole batch prefills in one step: two step shapes to compile for
    # this 30-layer model instead of five.
    return JaxInferRunner("smollm2-135m-instruct", max_model_len=256,
                          max_num_seqs=8, max_num_batched_tokens=512,
                          block_size=16, num_gpu_blocks_override=160,
                          compilation_cache_dir=xla_cache, dtype="float32")


@pytest.mark.slow
def test_embedded_greedy_matches_hf(hf_embedded, embedded_engine):
    ours = embedded_engine.generate_greedy_logprobs(PROMPTS, MAX_TOKENS,
                                                    NUM_LOGPROBS)
    hf = hf_embedded.generate_greedy_logprobs(PROMPTS, MAX_TOKENS,
                                              NUM_LOGPROBS)
    diverged = check_logprobs_close(hf, ours, "hf", "jaxinfer",
                                    logprob_atol=LOGPROB_ATOL)
    # A real (quantized) model may meet a near-tie; a systematic error would
    # diverge everywhere.
    assert diverged <= 2, f"{diverged} of {len(PROMPTS)} prompts diverged"


@pytest.mark.slow
def test_embedded_prefill_logits_match_hf(hf_embedded, embedded_engine):
    ids = [hf_embedded.encode(p) for p in PROMPTS]
    # The engine's own (torch-free) GGUF tokenizer agrees with HF's.
    assert ids == [embedded_engine.tokenizer.encode(p) for p in PROMPTS]
    hf = hf_embedded.prefill_logits(ids)
    ours = embedded_engine.prefill_logits(ids)
    assert _max_abs_diff(hf, ours) < LOGITS_ATOL
