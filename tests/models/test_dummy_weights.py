"""vLLM's load-format "dummy": random params with the model's exact tree."""

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxinfer.models import ModelConfig, model_class
from jaxinfer.models.abstract import abstract_variables
from jaxinfer.models.dummy import random_params


def test_random_params_match_the_abstract_tree():
    cfg = ModelConfig("Qwen2ForCausalLM", 256, 32, 64, 2, 4, 2, 8, 128,
                      attention_bias=True)
    model = model_class(cfg.architecture)(cfg)
    params = random_params(model, cfg, jnp.bfloat16, std=0.5)
    expected = nn.unbox(abstract_variables(model, cfg)["params"])
    shapes = lambda t: jax.tree_util.tree_map(lambda x: x.shape, t)
    assert shapes(params) == shapes(expected)
    q = params["layers_0"]["self_attn"]["q_proj"]
    assert q["kernel"].dtype == jnp.bfloat16
    assert abs(float(jnp.std(q["kernel"].astype(jnp.float32))) - 0.5) < 0.1
    assert float(jnp.abs(q["bias"]).max()) == 0.0
    assert float(params["norm"]["scale"].min()) == 1.0
    # Different layers get different draws.
    k0 = params["layers_0"]["mlp"]["up_proj"]["kernel"]
    k1 = params["layers_1"]["mlp"]["up_proj"]["kernel"]
    assert not bool(jnp.array_equal(k0, k1))


def test_a_model_with_fewer_layers_shares_the_longer_ones_draws():
    """Draws follow each param's name: the first layers, embeddings and
    head of a 2-layer model equal a 4-layer model's (speculative
    decoding's benchmarks draft with such a model)."""
    import dataclasses
    cfg = ModelConfig("LlamaForCausalLM", 256, 32, 64, 4, 4, 2, 8, 128)
    short_cfg = dataclasses.replace(cfg, num_layers=2)
    long = random_params(model_class(cfg.architecture)(cfg), cfg, jnp.float32)
    short = random_params(model_class(cfg.architecture)(short_cfg), short_cfg,
                          jnp.float32)
    assert set(short) == set(long) - {"layers_2", "layers_3"}
    for name, tree in short.items():
        for a, b in zip(jax.tree_util.tree_leaves(tree),
                        jax.tree_util.tree_leaves(long[name])):
            assert bool(jnp.array_equal(a, b)), name
    assert not bool(jnp.array_equal(
        random_params(model_class(cfg.architecture)(cfg), cfg, jnp.float32,
                      seed=1)["layers_0"]["mlp"]["up_proj"]["kernel"],
        long["layers_0"]["mlp"]["up_proj"]["kernel"]))
