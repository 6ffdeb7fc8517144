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
