"""A step program traces its decoder layer once, however many layers the
model has (``models/llama.py: apply_layer``): building each bucket's
program (warm-up, and every cache-warm start) costs one layer's tracing,
not L. The outputs stay those of the unrolled layers (the golden-token and
HF-parity tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models import AttentionMetadata, ModelConfig, llama, model_class, run_model
from jaxinfer.models.dummy import random_params
from jaxinfer.models.runtime import model_constants
from jaxinfer.pallas_kernels import init_kv_pages


def _model(**fields):
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=96,
                      max_position_embeddings=64, **fields)
    model = model_class(cfg.architecture)(cfg, backend="reference",
                                          dtype=jnp.float32)
    return cfg, model


def _one_sequence(cfg, T: int):
    """An empty pool and the metadata of one T-token prefill on page 1."""
    kv = init_kv_pages(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim,
                       jnp.float32)
    md = AttentionMetadata(
        slot_mapping=np.arange(16, 16 + T, dtype=np.int32),
        block_tables=np.array([[1]], np.int32), kv_lens=np.array([T], np.int32),
        cu_q_lens=np.array([0, T], np.int32), num_seqs=np.array([1], np.int32))
    return kv, md


def _lower_step(model, cfg, params, T: int):
    kv, md = _one_sequence(cfg, T)
    step = jax.jit(lambda p, kv, ids, pos: run_model(
        model, p, model_constants(model, 64), kv, ids, pos, md,
        np.array([T - 1], np.int32)))
    ids = jnp.arange(T, dtype=jnp.int32) % cfg.vocab_size
    step.lower(params, kv, ids, jnp.arange(T, dtype=jnp.int32))


def test_a_step_traces_one_layer_for_all_of_them(monkeypatch):
    # An odd shape no other test uses, so the jit cache of apply_layer is
    # cold for it, and 6 layers so one trace per layer would show.
    cfg, model = _model(hidden_size=40, intermediate_size=72, num_layers=6,
                        num_heads=5, num_kv_heads=1, head_dim=8)
    params = random_params(model, cfg, jnp.float32)
    calls = []
    real_call = llama.DecoderLayer.__call__

    def counting_call(self, *args):
        calls.append(self.name)
        return real_call(self, *args)
    monkeypatch.setattr(llama.DecoderLayer, "__call__", counting_call)
    _lower_step(model, cfg, params, T=3)
    assert len(calls) == 1, calls  # not cfg.num_layers
    _lower_step(model, cfg, params, T=3)  # a second program of the same shapes
    assert len(calls) == 1, calls
    _lower_step(model, cfg, params, T=5)  # new shapes trace the layer again
    assert len(calls) == 2, calls


def test_the_traced_layer_gives_the_unrolled_layers_logits():
    """The same params through apply_layer and through the layers as plain
    submodules (the init path, which declares them) give the same logits."""
    cfg, model = _model(hidden_size=32, intermediate_size=64, num_layers=3,
                        num_heads=4, num_kv_heads=2, head_dim=8)
    params = random_params(model, cfg, jnp.float32)
    T = 4
    kv, md = _one_sequence(cfg, T)
    ids = jnp.array([5, 17, 3, 60], jnp.int32)
    pos = jnp.arange(T, dtype=jnp.int32)
    rows = np.array([T - 1], np.int32)
    consts = model_constants(model, 64)
    def logits(m):  # each compiled as the engine compiles its step
        return jax.jit(lambda p: run_model(m, p, consts, kv, ids, pos, md,
                                           rows)[0])(params)
    traced = logits(model)

    class Unrolled(type(model)):
        def is_initializing(self):  # take the submodule path at apply time
            return True
    unrolled = Unrolled(cfg, backend="reference", dtype=jnp.float32)
    plain = logits(unrolled)
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(plain))


def test_abstract_params_of_one_layer_repeated_equal_the_full_init():
    """abstract_variables inits one layer of a uniform-layer model and
    repeats it; the tree (paths, shapes, dtypes, logical axes) is the one
    the full L-layer init gives."""
    import flax.linen as nn

    from jaxinfer.models.abstract import _abstract_init, abstract_variables
    cfg, model = _model(hidden_size=32, intermediate_size=64, num_layers=4,
                        num_heads=4, num_kv_heads=2, head_dim=8,
                        attention_bias=True)
    fast = abstract_variables(model, cfg)["params"]
    full = _abstract_init(model, cfg)["params"]
    every = abstract_variables(model, cfg, every_layer=True)["params"]

    def describe(tree):
        leaves = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))[0]
        return [(jax.tree_util.keystr(p), x.value.shape, x.value.dtype, x.names)
                for p, x in leaves]
    assert describe(fast) == describe(full) == describe(every)
    assert len(describe(full)) > 4 * 9  # every layer's tensors are there


def test_layers_of_one_quantization_pattern_share_a_trace(monkeypatch):
    """Quantization overrides give layers 2 and 4 an unquantized down
    projection (as a GGUF file gives some layers other block types): the
    step traces one layer per pattern (2, not 6), and its logits equal
    the layers run as plain submodules."""
    from jaxinfer.models.quantization import QuantizationConfig
    from jaxinfer.models.quantization.methods import Int8Weights
    odd = tuple(((f"layers_{i}", "mlp", "down_proj"), None) for i in (2, 4))
    q = QuantizationConfig(method="int8", checkpoint_format="float",
                           scheme=Int8Weights(), overrides=odd)
    cfg, model = _model(hidden_size=24, intermediate_size=56, num_layers=6,
                        num_heads=3, num_kv_heads=1, head_dim=8,
                        quantization=q)
    params = random_params(model, cfg, jnp.float32)
    assert params["layers_2"]["mlp"]["down_proj"]["kernel"].dtype == jnp.float32
    assert params["layers_3"]["mlp"]["down_proj"]["weight"].dtype == jnp.int8
    calls = []
    real_call = llama.DecoderLayer.__call__

    def counting_call(self, *args):
        calls.append(self.cfg.quantization.overrides)
        return real_call(self, *args)
    monkeypatch.setattr(llama.DecoderLayer, "__call__", counting_call)
    _lower_step(model, cfg, params, T=3)
    assert sorted(map(len, calls)) == [0, 1], calls

    T = 3
    kv, md = _one_sequence(cfg, T)
    ids, pos = jnp.array([5, 17, 3], jnp.int32), jnp.arange(T, dtype=jnp.int32)
    consts = model_constants(model, 64)

    def logits(m):
        return jax.jit(lambda p: run_model(m, p, consts, kv, ids, pos, md,
                                           np.array([T - 1], np.int32))[0])(params)

    class Unrolled(type(model)):
        def is_initializing(self):
            return True
    monkeypatch.setattr(llama.DecoderLayer, "__call__", real_call)
    np.testing.assert_array_equal(
        np.asarray(logits(model)),
        np.asarray(logits(Unrolled(cfg, backend="reference", dtype=jnp.float32))))
