"""A new architecture in one file, end to end.

``ToyDenseForCausalLM`` is a renamed Llama whose MLP is the dense
``act(x W_up) W_down`` instead of Llama's gated one. Everything the engine
needs about it is the module subclass and the ``ModelSpec`` below: once
registered, a plain HF-style folder (config.json naming the architecture,
safetensors, tokenizer) runs through ``LLM.generate`` like any built-in
model, and its greedy tokens equal a NumPy forward of the same
architecture written independently here. The registry refuses specs that
break the contract.
"""

from __future__ import annotations

import functools
import json
import math
import os

import numpy as np
import pytest
from flax import linen as nn

from jaxinfer.models import (
    MissingWeightError,
    ModelContractError,
    ModelSpec,
    register_model,
    resolve_model,
)
from jaxinfer.models.config import decoder_config_from_hf
from jaxinfer.models.llama import LlamaForCausalLM, decoder_weights
from jaxinfer.models.mlp import DenseMLP
from jaxinfer.models.registry import unregister_model

ARCH = "ToyDenseForCausalLM"


# -- the whole architecture -------------------------------------------------

class ToyDenseForCausalLM(LlamaForCausalLM):
    mlp_cls = DenseMLP


TOY_SPEC = ModelSpec(
    architecture=ARCH, model=ToyDenseForCausalLM,
    config_from_hf=lambda hf: decoder_config_from_hf(hf, ARCH),
    weights=functools.partial(decoder_weights, mlp_cls=DenseMLP))

# ---------------------------------------------------------------------------

HF_CONFIG = dict(architectures=[ARCH], vocab_size=49152, hidden_size=64,
                 intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=256, rms_norm_eps=1e-5,
                 rope_theta=10000.0, hidden_act="gelu_pytorch_tanh",
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                 torch_dtype="float32")
PROMPTS = ["Hello, my name is", "x",
           "One two three four five six seven eight nine ten eleven twelve"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def registered():
    register_model(TOY_SPEC)
    yield TOY_SPEC
    unregister_model(ARCH)


@pytest.fixture(scope="module")
def toy_dir(registered, tmp_path_factory):
    """A random-weight checkpoint written from the spec's own weight list
    (peaked weights, as tests/tiny_models.py, so greedy meets no near-tie)."""
    from safetensors.numpy import save_file

    from tests.tiny_models import embedded_tokenizer
    path = str(tmp_path_factory.mktemp("toy-dense"))
    cfg = TOY_SPEC.config_from_hf(HF_CONFIG)
    rng = np.random.default_rng(0)
    tensors = {}
    for w in TOY_SPEC.weights(cfg):
        if len(w.hf_shape) == 1:  # norm scales
            x = 1.0 + 0.1 * rng.standard_normal(w.hf_shape)
        else:
            x = 0.08 * rng.standard_normal(w.hf_shape)
        tensors[w.hf_name] = x.astype(np.float32)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(HF_CONFIG, f)
    embedded_tokenizer().save_pretrained(path)
    return path


def _reference_greedy(path: str, prompt_ids: list[int], steps: int):
    """Greedy tokens from a float64 NumPy forward over the whole sequence
    (no pages, no cache): the toy architecture as its definition reads."""
    from safetensors.numpy import load_file
    w = {k: v.astype(np.float64) for k, v in
         load_file(os.path.join(path, "model.safetensors")).items()}
    c = HF_CONFIG
    N, K = c["num_attention_heads"], c["num_key_value_heads"]
    H = c["hidden_size"] // N
    eps = c["rms_norm_eps"]

    def rms(x, scale):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale

    def rope(x, pos):  # rotate-half, [T, heads, H]
        inv = 1.0 / c["rope_theta"] ** (np.arange(0, H, 2) / H)
        ang = pos[:, None] * inv[None]
        cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None]
        sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None]
        return x * cos + np.concatenate([-x[..., H // 2:], x[..., :H // 2]],
                                        -1) * sin

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                      (x + 0.044715 * x**3)))

    def logits(ids):
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        x = w["model.embed_tokens.weight"][ids]
        causal = np.tril(np.ones((T, T), bool))
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, N, H)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, K, H)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, K, H)
            q, k = rope(q, pos), rope(k, pos)
            k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)
            s = np.einsum("tnh,snh->nts", q, k) / math.sqrt(H)
            s = np.where(causal, s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            o = np.einsum("nts,snh->tnh", pr, v).reshape(T, N * H)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            up = gelu_tanh(h @ w[p + "mlp.up_proj.weight"].T)
            x = x + up @ w[p + "mlp.down_proj.weight"].T
        x = rms(x, w["model.norm.weight"])
        return x @ w["lm_head.weight"].T

    ids = list(prompt_ids)
    for _ in range(steps):
        ids.append(int(np.argmax(logits(ids)[-1])))
    return ids[len(prompt_ids):]


@pytest.mark.slow
def test_toy_architecture_generates_through_llm(toy_dir):
    from jaxinfer import LLM, SamplingParams
    llm = LLM(model=toy_dir, dtype="float32", max_model_len=128,
              max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
              num_gpu_blocks_override=32)
    assert isinstance(llm.llm_engine.runner.model, ToyDenseForCausalLM)
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                        ignore_eos=True)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outs):
        want = _reference_greedy(toy_dir, tok.encode(prompt), MAX_TOKENS)
        assert list(out.outputs[0].token_ids) == want, prompt


def test_toy_checkpoint_needs_the_dense_mlp(toy_dir, tmp_path):
    """The spec's weight list is what loads: the toy folder lacks Llama's
    gate_proj, so read as a Llama it is refused, naming the tensor."""
    from jaxinfer.models import load_params
    cfg_path = os.path.join(toy_dir, "config.json")
    llama_dir = tmp_path / "as-llama"
    llama_dir.mkdir()
    for name in os.listdir(toy_dir):
        os.symlink(os.path.join(toy_dir, name), llama_dir / name)
    os.unlink(llama_dir / "config.json")
    with open(cfg_path) as f:
        hf = json.load(f)
    hf["architectures"] = ["LlamaForCausalLM"]
    (llama_dir / "config.json").write_text(json.dumps(hf))
    with pytest.raises(MissingWeightError, match="gate_proj"):
        load_params(resolve_model(str(llama_dir)), np.float32)
    files = resolve_model(toy_dir)
    assert files.config.architecture == ARCH
    assert files.config.num_params == sum(
        math.prod(w.hf_shape) for w in TOY_SPEC.weights(files.config))


def test_spec_weights_fill_the_module_params(registered):
    """The spec's weight list and the module's declared params agree."""
    from jaxinfer.models.abstract import abstract_variables
    from jaxinfer.models.spec import verify_weights
    cfg = TOY_SPEC.config_from_hf(HF_CONFIG)
    abstract = nn.unbox(abstract_variables(TOY_SPEC.model(cfg), cfg)["params"])
    verify_weights(TOY_SPEC, cfg, abstract)
    # A weight list for the gated MLP does not fit the dense module.
    gated = ModelSpec(ARCH, ToyDenseForCausalLM, TOY_SPEC.config_from_hf,
                      decoder_weights)
    with pytest.raises(ValueError, match="gate_proj"):
        verify_weights(gated, cfg, abstract)


# -- the contract, checked at registration ----------------------------------

class _NoPages(nn.Module):  # __call__ without the paged-KV arguments
    cfg: object
    backend: str = "reference"
    dtype: object = None
    mesh: object = None

    def constants(self, max_model_len):
        return {}

    def __call__(self, input_ids, positions):
        return input_ids


class _NoConstants(LlamaForCausalLM):
    constants = None


@pytest.mark.parametrize("model, match", [
    (_NoPages, r"__call__ takes \(input_ids, positions\)"),
    (_NoConstants, "constants"),
    (object, "flax.linen.Module"),
])
def test_registry_refuses_a_broken_model(model, match):
    spec = ModelSpec("BrokenForCausalLM", model, TOY_SPEC.config_from_hf,
                     TOY_SPEC.weights)
    with pytest.raises(ModelContractError, match=match):
        register_model(spec)
    with pytest.raises(ValueError, match="unsupported architecture"):
        resolve_model_config({"architectures": ["BrokenForCausalLM"]})


def test_registry_refuses_a_second_spec_for_a_name():
    from jaxinfer.models import model_spec
    llama = model_spec("LlamaForCausalLM")
    with pytest.raises(ModelContractError, match="already registered"):
        register_model(llama)
    renamed = ModelSpec("OtherLlamaForCausalLM", llama.model,
                        llama.config_from_hf, llama.weights, gguf=llama.gguf)
    with pytest.raises(ModelContractError, match="GGUF architecture 'llama'"):
        register_model(renamed)


def resolve_model_config(hf: dict):
    from jaxinfer.models import model_config_from_hf
    return model_config_from_hf(hf)
