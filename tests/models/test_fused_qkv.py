"""One q/k/v weight per attention layer (models/fused_qkv.py) against the
separate q_proj / k_proj / v_proj it replaces.

The fused weight holds the same numbers regrouped by kv head, so the two
forms give the same logits. On CPU they are bitwise equal where XLA:CPU's
matmul sums each output in the same order. It chooses how to block the
contracted axis from the product's shape, so with several rows a wider
product may sum in another order: the embedded model's (D = 576) and a
lone kv head's (its k and v are products of H columns alone). There the
logits agree within a tolerance (float32 sums of D terms, through every
layer: TINY_TOL, EMBEDDED_TOL, a few times the differences seen) and the
greedy token at every position is the same. The fused form also loads from
the GGUF weight cache and from an orbax checkpoint (both hold the separate
tensors), quantizes to fp8 at load row for row as the separate layers do,
and stays off wherever it does not apply (LoRA, other quantizations, kv
heads that do not split evenly, families with their own attention, the
CPU by default).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxinfer.models import fused_qkv, load_params, model_class, model_constants, resolve_model
from jaxinfer.models.abstract import abstract_variables
from jaxinfer.models.dummy import random_params
from jaxinfer.models.weights import checkpoint_names, weight_specs
from tests.models.forward import packed_prefill_logits

TINY_TOL = 1e-5
EMBEDDED_TOL = 5e-4
PROMPTS = [[1, 5, 7, 9, 11, 300, 2000, 17, 4, 4, 4, 90, 91, 92, 93, 94, 95, 96],
           [4, 4], [700]]

# id -> (tiny_models arch, config overrides, logits tolerance; None: bitwise)
CASES = {
    "llama-gqa": ("llama", {}, None),  # N 4, K 2: G = 2
    "llama-mha": ("llama", {"num_key_value_heads": 4}, None),  # G = 1
    "llama-one-kv-head": ("llama", {"num_key_value_heads": 1}, TINY_TOL),
    "qwen2-bias": ("qwen2", {}, None),
    "qwen3-qk-norm": ("qwen3", {}, None),
    "phi3-stored-qkv": ("phi3", {}, None),  # one stored q;k;v tensor
    "mixtral": ("mixtral", {}, None),
}


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """The engine fuses on CPU too (it does on GPU by default)."""
    monkeypatch.setattr(fused_qkv, "DEFAULT_PLATFORMS", ("gpu", "cpu"))


def _both(files):
    """{fused: (model, params)} for the separate and the fused form."""
    out = {}
    for fused in (False, True):
        cfg = dataclasses.replace(files.config, fused_qkv=fused)
        model = model_class(cfg.architecture)(cfg)
        out[fused] = model, load_params(dataclasses.replace(files, config=cfg),
                                        jnp.float32)
    return out


def _logits(model, params):
    return packed_prefill_logits(model, params, model_constants(model, 128),
                                 PROMPTS, 16, jnp.float32)


def _assert_same_logits(sep, fused, tol):
    for a, b in zip(sep, fused):
        if tol is None:
            np.testing.assert_array_equal(b, a)
        else:
            np.testing.assert_allclose(b, a, rtol=0, atol=tol)
        np.testing.assert_array_equal(b.argmax(-1), a.argmax(-1))


@pytest.mark.parametrize("case", list(CASES))
def test_fused_and_separate_give_the_same_logits(case, tiny_model_factory):
    arch, overrides, tol = CASES[case]
    forms = _both(resolve_model(tiny_model_factory(arch, **overrides)))
    attn = forms[True][1]["layers_0"]["self_attn"]
    assert set(attn) >= {"qkv_proj"} and not set(attn) & {"q_proj", "k_proj",
                                                           "v_proj"}
    _assert_same_logits(_logits(*forms[False]), _logits(*forms[True]), tol)


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-bias"])
def test_layout_is_query_heads_then_k_then_v_per_kv_head(case,
                                                         tiny_model_factory):
    """kernel[:, k, j] is query head k * G + j (HF's grouping onto kv head
    k), kernel[:, k, G] kv head k's key, kernel[:, k, G + 1] its value."""
    arch, overrides, _ = CASES[case]
    files = resolve_model(tiny_model_factory(arch, **overrides))
    forms = _both(files)
    K, N = files.config.num_kv_heads, files.config.num_heads
    G = N // K
    sep = forms[False][1]["layers_1"]["self_attn"]
    fused = forms[True][1]["layers_1"]["self_attn"]["qkv_proj"]
    kinds = ["kernel"] + (["bias"] if files.config.attention_bias else [])
    assert kinds == sorted(fused, reverse=True)
    for kind in kinds:
        f = np.asarray(fused[kind])
        q, k, v = (np.asarray(sep[n][kind]) for n in ("q_proj", "k_proj",
                                                      "v_proj"))
        assert f.shape[-3:] == (K, G + 2, files.config.head_dim)
        for kv in range(K):
            for j in range(G):
                np.testing.assert_array_equal(f[..., kv, j, :],
                                              q[..., kv * G + j, :])
            np.testing.assert_array_equal(f[..., kv, G, :], k[..., kv, :])
            np.testing.assert_array_equal(f[..., kv, G + 1, :], v[..., kv, :])


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_dummy_weights_are_the_separate_ones_joined(quantization,
                                                    tiny_model_factory):
    """Random weights follow the fused module and hold the separate
    model's draws (a draft model or an EAGLE head built from the separate
    form then matches a fused target), fp8 codes and scales too."""
    files = resolve_model(tiny_model_factory("qwen2"), "dummy",
                          quantization=quantization)
    forms = {}
    for fused in (False, True):
        cfg = dataclasses.replace(files.config, fused_qkv=fused)
        model = model_class(cfg.architecture)(cfg)
        forms[fused] = model, random_params(model, cfg, jnp.float32)
    model, params = forms[True]
    axes = nn.get_partition_spec(abstract_variables(model, model.cfg))[
        "params"]["layers_0"]["self_attn"]["qkv_proj"]
    qkv = params["layers_0"]["self_attn"]["qkv_proj"]
    assert set(qkv) == set(axes)
    if quantization is None:
        assert qkv["kernel"].shape == (64, 2, 4, 16)
        assert tuple(axes["kernel"]) == fused_qkv.KERNEL_AXES
    else:
        assert qkv["weight"].shape == (2, 4, 16, 64)
    # The same weights: the same logits, bitwise (qwen2-bias is bitwise
    # above).
    _assert_same_logits(_logits(*forms[False]), _logits(*forms[True]),
                        tol=None if quantization is None else TINY_TOL)


# -- when it applies ----------------------------------------------------------

def test_on_by_default_on_gpu_only(tiny_model_factory):
    cfg = resolve_model(tiny_model_factory()).config
    assert not cfg.fused_qkv  # the checkpoint's own layout
    assert fused_qkv.with_fused_qkv(cfg, "gpu").fused_qkv
    assert not fused_qkv.with_fused_qkv(cfg, "cpu").fused_qkv


@pytest.mark.parametrize("quantization,fuses", [
    ("fp8", True),  # per-channel scales, quantized at load
    ("int8", False)])
def test_quantized_at_load(quantization, fuses, tiny_model_factory):
    cfg = resolve_model(tiny_model_factory(),
                        quantization=quantization).config
    assert fused_qkv.fusable(cfg) is fuses
    assert fused_qkv.with_fused_qkv(cfg, "gpu").fused_qkv is fuses


def test_other_quantizations_keep_separate_weights(tiny_model_factory):
    from jaxinfer.models.quantization import Fp8Weights, GroupedWeights, QuantizationConfig
    cfg = resolve_model(tiny_model_factory()).config
    awq = GroupedWeights(bits=4, group_size=128, zeros=True)
    for q in (QuantizationConfig("awq", "awq", awq),
              QuantizationConfig("fp8", "fp8", Fp8Weights(per_channel=True)),
              QuantizationConfig("fp8", "float", Fp8Weights()),  # per tensor
              QuantizationConfig("fp8", "float", Fp8Weights(per_channel=True),
                                 overrides=((("layers_0", "mlp", "down_proj"),
                                             None),)),
              QuantizationConfig("gguf", "gguf", None)):
        assert not fused_qkv.with_fused_qkv(
            dataclasses.replace(cfg, quantization=q), "gpu").fused_qkv, q


def test_lora_and_uneven_kv_heads_keep_separate_weights(tiny_model_factory):
    cfg = resolve_model(tiny_model_factory()).config  # K = 2
    assert not fused_qkv.with_fused_qkv(cfg, "gpu", lora=True).fused_qkv
    assert fused_qkv.with_fused_qkv(cfg, "gpu", tensor_parallel_size=2).fused_qkv
    # Four devices over two kv heads: the rules would replicate the whole
    # fused weight, query heads too.
    assert not fused_qkv.with_fused_qkv(cfg, "gpu",
                                        tensor_parallel_size=4).fused_qkv


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_families_with_their_own_attention_stay_separate(arch,
                                                         tiny_model_factory):
    cfg = resolve_model(tiny_model_factory(arch)).config
    assert not fused_qkv.with_fused_qkv(cfg, "gpu").fused_qkv


def test_engine_fuses_where_it_applies(tiny_model_factory, fused_on_cpu):
    from jaxinfer import LLM
    path = tiny_model_factory()
    kw = dict(max_model_len=64, num_gpu_blocks_override=16, dtype="float32")

    def attn(llm):
        runner = llm.llm_engine.runner
        return runner.cfg.fused_qkv, set(runner.params["layers_0"]["self_attn"])

    assert attn(LLM(path, **kw)) == (True, {"qkv_proj", "o_proj"})
    separate = (False, {"q_proj", "k_proj", "v_proj", "o_proj"})
    assert attn(LLM(path, enable_lora=True, **kw)) == separate
    fused, names = attn(LLM(path, quantization="int8", **kw))
    assert not fused and {"q_proj", "k_proj", "v_proj"} <= names


def test_saved_step_programs_of_one_form_are_never_read_for_the_other(
        tiny_model_factory, monkeypatch):
    from jaxinfer import LLM
    from jaxinfer.worker.executable_cache import programs_fingerprint

    def fingerprint():
        runner = LLM(tiny_model_factory(), max_model_len=64,
                     num_gpu_blocks_override=16).llm_engine.runner
        return programs_fingerprint(runner.programs, runner.device_state())

    separate = fingerprint()
    monkeypatch.setattr(fused_qkv, "DEFAULT_PLATFORMS", ("gpu", "cpu"))
    assert fingerprint() != separate


# -- loading ------------------------------------------------------------------

def test_fp8_at_load_quantizes_each_row_as_the_separate_layers(
        tiny_model_factory):
    files = resolve_model(tiny_model_factory(), quantization="fp8")
    forms = _both(files)
    G = files.config.num_heads // files.config.num_kv_heads
    sep = forms[False][1]["layers_0"]["self_attn"]
    fused = forms[True][1]["layers_0"]["self_attn"]["qkv_proj"]
    for name in ("weight", "weight_scale"):
        f = np.asarray(fused[name]).view(np.uint8) if name == "weight" else \
            np.asarray(fused[name])
        q, k, v = (np.asarray(sep[n][name]) for n in ("q_proj", "k_proj",
                                                      "v_proj"))
        if name == "weight":
            q, k, v = (a.view(np.uint8) for a in (q, k, v))
        # weight [K, G + 2, H, D] and weight_scale [K, G + 2, H] against
        # q [N, H, ...], k and v [K, H, ...].
        np.testing.assert_array_equal(f[:, :G].reshape(q.shape), q)
        np.testing.assert_array_equal(f[:, G], k)
        np.testing.assert_array_equal(f[:, G + 1], v)
    _assert_same_logits(_logits(*forms[False]), _logits(*forms[True]),
                        tol=TINY_TOL)


def test_orbax_checkpoint_restores_into_the_fused_form(tiny_model_factory,
                                                       tmp_path):
    from jaxinfer.entrypoints.convert import convert
    from jaxinfer.models.orbax_checkpoint import restore_params
    path = tiny_model_factory("qwen2")  # with q/k/v biases
    out = convert(path, str(tmp_path / "orbax"), dtype="float32")
    files = resolve_model(path)
    cfg = dataclasses.replace(files.config, fused_qkv=True)
    model = model_class(cfg.architecture)(cfg)
    restored = restore_params(out, model, cfg, jnp.float32)
    loaded = load_params(dataclasses.replace(files, config=cfg), jnp.float32)
    assert (jax.tree_util.tree_structure(restored)
            == jax.tree_util.tree_structure(loaded))
    for a, b in zip(jax.tree_util.tree_leaves(restored),
                    jax.tree_util.tree_leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# -- the embedded GGUF model --------------------------------------------------

@pytest.fixture(scope="module")
def embedded_files():
    from jaxinfer.models.embedded import DEFAULT_MODEL
    return resolve_model(DEFAULT_MODEL)


@pytest.mark.slow
def test_embedded_gguf_logits_and_weight_cache(embedded_files):
    from jaxinfer.models.weight_cache import CachedWeights
    files = embedded_files
    cfg = files.config
    assert cfg.num_heads // cfg.num_kv_heads > 1  # GQA
    # The weight cache holds the checkpoint's tensors under their HF names,
    # which either layout reads; nothing in it is in the fused layout.
    if isinstance(files.reader, CachedWeights):
        names = set(files.reader.files)
        assert "model.layers.0.self_attn.q_proj.weight" in names
        assert not any("qkv" in n for n in names)
    fused_cfg = dataclasses.replace(cfg, fused_qkv=True)
    wanted = {n for s in weight_specs(fused_cfg) for n in checkpoint_names(s)}
    assert wanted == {s.hf_name for s in weight_specs(cfg)}
    forms = _both(files)
    _assert_same_logits(_logits(*forms[False]), _logits(*forms[True]),
                        tol=EMBEDDED_TOL)


@pytest.mark.slow
@pytest.mark.xdist_group("hf_embedded")
def test_embedded_greedy_tokens_fused_equal_the_recorded(fused_on_cpu,
                                                         tmp_path):
    """The recorded greedy tokens of test_golden_tokens (the separate
    form's), from an engine that fuses."""
    from tests.models.test_golden_tokens import MAX_TOKENS, _recorded
    from tests.models.test_hf_parity import ENGINE
    from tests.models.test_hf_parity import PROMPTS as TEXT_PROMPTS
    from tests.runners import JaxInferRunner
    runner = JaxInferRunner("smollm2-135m-instruct",
                            compilation_cache_dir=str(tmp_path), **ENGINE)
    assert runner.engine.runner.cfg.fused_qkv
    tokens = [ids for ids, _ in runner.generate_greedy(TEXT_PROMPTS,
                                                       MAX_TOKENS)]
    assert tokens == _recorded()["tokens"]["embedded"]
