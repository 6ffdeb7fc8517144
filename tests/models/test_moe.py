"""Mixture-of-experts models (Mixtral, Qwen3-MoE) against HF transformers
(torch, float32), and the grouped expert product (ragged_dot, and the
grouped-matmul kernel interpreted) against a dense loop.

Tiny random checkpoints (tests/tiny_models.py: 4 experts, 2 per token)
run mixed-length prompts as one engine batch with chunked prefill (at most
64 tokens a step) and prefix caching on; the prompts are then run again,
so their full pages come from the prefix cache. Greedy tokens must equal
HF's token for token both times, and the logits at every prompt position
must agree within 1e-4.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxinfer.models import model_class, resolve_model
from jaxinfer.models.abstract import abstract_variables
from jaxinfer.models.errors import ModelConfigError
from jaxinfer.models.moe import dense_experts_reference, grouped_experts, route
from jaxinfer.models.registry import model_spec
from jaxinfer.models.spec import verify_weights
from tests.models.test_hf_parity import ENGINE, PROMPTS
from tests.runners import HfRunner, JaxInferRunner, check_outputs_equal

MAX_TOKENS = 16
LOGITS_ATOL = 1e-4

# id -> (tiny_models arch, config overrides)
CASES = {
    "mixtral": ("mixtral", {}),
    "qwen3-moe": ("qwen3_moe", {}),  # HF's default: no renormalisation
    "qwen3-moe-norm-topk": ("qwen3_moe", {"norm_topk_prob": True}),
    # The GPU's grouped-matmul kernel, interpreted. Eight experts make its
    # config differ from the ragged_dot case's, so no jitted layer traced
    # with the other implementation is reused.
    "mixtral-grouped-kernel": ("mixtral", {"num_local_experts": 8}),
}
KERNEL_CASES = {"mixtral-grouped-kernel"}


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tiny_model_factory, xla_cache):
    from jaxinfer.models import moe
    arch, overrides = CASES[request.param]
    path = tiny_model_factory(arch, **overrides)
    impl = "pallas_interpret" if request.param in KERNEL_CASES else None
    old, moe.EXPERTS_IMPL = moe.EXPERTS_IMPL, impl
    try:
        yield (HfRunner(path),
               JaxInferRunner(path, compilation_cache_dir=xla_cache,
                              enable_prefix_caching=True, **ENGINE))
    finally:
        moe.EXPERTS_IMPL = old


def test_greedy_equals_hf_with_chunked_prefill_and_prefix_cache(tiny):
    hf, ours = tiny
    want = hf.generate_greedy(PROMPTS, MAX_TOKENS)
    assert sum(len(ids) for ids, _ in want) >= MAX_TOKENS * len(PROMPTS) // 2
    check_outputs_equal(want, ours.generate_greedy(PROMPTS, MAX_TOKENS),
                        "hf", "jaxinfer")
    hits = ours.engine.get_stats().prefix_cache_hits
    check_outputs_equal(want, ours.generate_greedy(PROMPTS, MAX_TOKENS),
                        "hf", "jaxinfer (prefix cached)")
    assert ours.engine.get_stats().prefix_cache_hits > hits


def test_prefill_logits_match_hf(tiny):
    hf, ours = tiny
    ids = [hf.encode(p) for p in PROMPTS]
    want = hf.prefill_logits(ids)
    got = ours.prefill_logits(ids)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert max(float(np.abs(g - w).max())
               for g, w in zip(got, want)) < LOGITS_ATOL


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_weights_fill_the_module(tiny_model_factory, arch):
    cfg = resolve_model(tiny_model_factory(arch)).config
    params = nn.unbox(abstract_variables(model_class(cfg.architecture)(cfg),
                                         cfg)["params"])
    verify_weights(model_spec(cfg.architecture), cfg, params)
    assert params["layers_0"]["mlp"]["gate_proj"].shape == (4, 64, (
        128 if arch == "mixtral" else 64))


def test_num_params_equals_hf(tiny_model_factory):
    import torch
    from transformers import AutoModelForCausalLM
    path = tiny_model_factory("mixtral")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert resolve_model(path).config.num_params == sum(
        p.numel() for p in hf.parameters())


@pytest.mark.parametrize("field,value", [("mlp_only_layers", [1]),
                                         ("decoder_sparse_step", 2)])
def test_dense_qwen3_moe_layers_are_refused(field, value):
    from jaxinfer.models.qwen3_moe import qwen3_moe_config_from_hf
    from tests.tiny_models import hf_config
    hf = hf_config("qwen3_moe", **{field: value}).to_dict()
    with pytest.raises(ModelConfigError, match=field):
        qwen3_moe_config_from_hf(hf)


def test_bad_expert_counts_are_refused(tiny_model_factory):
    cfg = resolve_model(tiny_model_factory("mixtral")).config
    with pytest.raises(ModelConfigError, match="num_experts_per_tok"):
        dataclasses.replace(cfg, num_experts_per_tok=5)


# -- the grouped product ----------------------------------------------------

def _experts(seed, T, D, F, E, k, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(keys[0], (T, D), dtype)
    logits = jax.random.normal(keys[1], (T, E))
    gate = jax.random.normal(keys[2], (E, D, F), dtype) * 0.2
    up = jax.random.normal(keys[3], (E, D, F), dtype) * 0.2
    down = jax.random.normal(keys[4], (E, F, D), dtype) * 0.2
    weights, experts = route(logits, k, renormalize=True)
    return x, weights, experts, gate, up, down


IMPLS = ["ragged_dot", "pallas_interpret"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,E,k", [(1, 4, 2), (7, 8, 2), (64, 8, 1),
                                   (33, 5, 3), (16, 4, 4)])
def test_grouped_experts_equal_the_dense_loop(T, E, k, impl):
    x, w, ids, gate, up, down = _experts(T * E + k, T, 16, 32, E, k)
    want = dense_experts_reference(x, w, ids, gate, up, down, jax.nn.silu)
    got = jax.jit(grouped_experts, static_argnums=(6, 8))(
        x, w, ids, gate, up, down, jax.nn.silu, 0, impl)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_expert_slices_sum_to_the_whole(impl):
    """Each device of an expert-parallel mesh computes its own experts'
    share (``first_expert``); the shares add up to the full product."""
    x, w, ids, gate, up, down = _experts(3, 20, 16, 32, 8, 2)
    whole = grouped_experts(x, w, ids, gate, up, down, jax.nn.silu)
    parts = [grouped_experts(x, w, ids, gate[s:s + 2], up[s:s + 2],
                             down[s:s + 2], jax.nn.silu, first_expert=s,
                             impl=impl)
             for s in range(0, 8, 2)]
    assert all(float(jnp.abs(p).max()) > 0 for p in parts)
    np.testing.assert_allclose(sum(parts), whole, rtol=1e-5, atol=1e-5)


def test_route_renormalises_only_when_asked():
    logits = jnp.array([[2.0, 1.0, 0.5, -1.0]])
    w, ids = route(logits, 2, renormalize=False)
    probs = jax.nn.softmax(logits)
    assert ids.tolist() == [[0, 1]]
    np.testing.assert_allclose(w, probs[:, :2], rtol=1e-6)
    w, _ = route(logits, 2, renormalize=True)
    np.testing.assert_allclose(w, probs[:, :2] / probs[:, :2].sum(),
                               rtol=1e-6)
