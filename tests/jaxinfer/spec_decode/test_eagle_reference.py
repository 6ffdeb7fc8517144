"""An EAGLE-3 head and the target's taps against a torch reference of
vLLM's math (``llama_eagle3.py``; Llama's ``aux_hidden_state_layers``):

- tap i is the residual stream entering target layer i (HF's
  ``hidden_states[i]``); the final-norm tap HF's last hidden state;
- one pass of the head over a sequence: fc over the three taps,
  q/k/v over [input_layernorm(embeds), hidden_norm(feature)], the
  residual the feature (or its norm with ``norm_before_residual``), the
  final norm, the head's lm_head over a draft vocabulary and d2t
  mapping draft ids to target ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxinfer.models import model_constants
from jaxinfer.models.eagle import EagleHead, eagle_config, read_head_weights
from jaxinfer.models.llama import LlamaForCausalLM
from jaxinfer.models.runtime import FINAL_NORM, run_model_tapped
from jaxinfer.pallas_kernels import init_kv_pages
from tests.models.forward import pack

B = 16  # page size of the direct calls
IDS = [5, 901, 77, 3020, 14, 14, 610, 2048, 33, 7, 19000, 41, 1234, 88,
       5, 901, 77, 300, 12]


@pytest.fixture(scope="module")
def target(eagle_target):
    """(HF model, jaxinfer config, params) of the EAGLE target."""
    import jax.numpy as jnp
    from transformers import AutoModelForCausalLM

    from jaxinfer.models import resolve_model
    from jaxinfer.models.loader import load_params
    files = resolve_model(eagle_target)
    hf = AutoModelForCausalLM.from_pretrained(
        eagle_target, dtype=torch.float32, local_files_only=True).eval()
    return hf, files.config, load_params(files, jnp.float32)


def _batch(ids: list[int]):
    pages = list(range(1, 1 + -(-len(ids) // B)))
    input_ids, positions, md, _ = pack([(ids, 0, pages)], B)
    return input_ids, positions, md, len(pages) + 1


def test_taps_are_the_residual_stream_entering_each_layer(target):
    hf, cfg, params = target
    model = LlamaForCausalLM(cfg, backend="reference")
    input_ids, positions, md, num_pages = _batch(IDS)
    kv = init_kv_pages(cfg.num_layers, num_pages, B, cfg.num_kv_heads,
                       cfg.head_dim, np.float32)
    _, hidden, _ = run_model_tapped(
        model, params, model_constants(model, 64), kv, input_ids, positions,
        md, np.zeros(1, np.int32), (0, 1, FINAL_NORM))
    with torch.no_grad():
        want = hf(torch.tensor([IDS]), output_hidden_states=True).hidden_states
    D = cfg.hidden_size
    for i, h in enumerate((want[0], want[1], want[-1])):
        np.testing.assert_allclose(np.asarray(hidden)[:, i * D:(i + 1) * D],
                                   h[0].numpy(), atol=1e-5)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, positions, theta):
    """HF Llama's default RoPE (halves rotated) of x [T, heads, H]."""
    H = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, H, 2, dtype=torch.float32) / H)
    ang = positions[:, None].float() * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    rot = torch.cat([-x[..., H // 2:], x[..., :H // 2]], -1)
    return x * cos + rot * sin


def eagle3_reference(w: dict, hf: dict, embeds, taps, positions):
    """vLLM's EAGLE-3 head over one sequence (causal attention from its
    first token): -> (prenorm features [T, D], target ids [T])."""
    eps = hf["rms_norm_eps"]
    theta = (hf.get("rope_parameters") or hf)["rope_theta"]
    N, K = hf["num_attention_heads"], hf["num_key_value_heads"]
    H = hf.get("head_dim") or hf["hidden_size"] // N

    def m(name):
        return w["midlayer." + name]
    feature = taps @ w["fc.weight"].T
    e = _rms(embeds, m("input_layernorm.weight"), eps)
    if hf.get("norm_before_residual"):
        h = residual = _rms(feature, m("hidden_norm.weight"), eps)
    else:
        residual, h = feature, _rms(feature, m("hidden_norm.weight"), eps)
    x = torch.cat([e, h], -1)
    T = x.shape[0]
    q = _rope((x @ m("self_attn.q_proj.weight").T).view(T, N, H), positions,
              theta)
    k = _rope((x @ m("self_attn.k_proj.weight").T).view(T, K, H), positions,
              theta)
    v = (x @ m("self_attn.v_proj.weight").T).view(T, K, H)
    k, v = (t.repeat_interleave(N // K, dim=1) for t in (k, v))
    scores = torch.einsum("tnh,snh->nts", q, k) * H ** -0.5
    scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), -torch.inf)
    attn = torch.einsum("nts,snh->tnh", scores.softmax(-1), v).reshape(T, -1)
    residual = attn @ m("self_attn.o_proj.weight").T + residual
    h = _rms(residual, m("post_attention_layernorm.weight"), eps)
    mlp = (torch.nn.functional.silu(h @ m("mlp.gate_proj.weight").T)
           * (h @ m("mlp.up_proj.weight").T)) @ m("mlp.down_proj.weight").T
    prenorm = mlp + residual
    logits = _rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T
    draft = logits.argmax(-1)
    return prenorm, draft + w["d2t"][draft]


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_an_eagle3_head_step_matches_vllms_math(target, norm_before_residual):
    """Random head weights (every tensor matters), a draft vocabulary of a
    sorted sixth of the target's ids."""
    import jax.numpy as jnp
    hf_model, cfg, params = target
    D, V = cfg.hidden_size, cfg.vocab_size
    hf = dict(hf_model.config.to_dict(), num_hidden_layers=1,
              draft_vocab_size=V // 6,
              eagle_aux_hidden_state_layer_ids=[0, 1, 1],
              norm_before_residual=norm_before_residual)
    Vd, I = hf["draft_vocab_size"], cfg.intermediate_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    gen = torch.Generator().manual_seed(3)

    def randn(*shape, std=0.08):
        return torch.randn(*shape, generator=gen) * std
    targets = torch.sort(torch.randperm(V, generator=gen)[:Vd]).values
    w = {"fc.weight": randn(D, 3 * D, std=0.1),
         "norm.weight": 1 + randn(D, std=0.2),
         "lm_head.weight": randn(Vd, D),
         "d2t": targets - torch.arange(Vd)}
    for name, shape in (("self_attn.q_proj.weight", (N * H, 2 * D)),
                        ("self_attn.k_proj.weight", (K * H, 2 * D)),
                        ("self_attn.v_proj.weight", (K * H, 2 * D)),
                        ("self_attn.o_proj.weight", (D, N * H)),
                        ("mlp.gate_proj.weight", (I, D)),
                        ("mlp.up_proj.weight", (I, D)),
                        ("mlp.down_proj.weight", (D, I))):
        w["midlayer." + name] = randn(*shape)
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[f"midlayer.{name}.weight"] = 1 + randn(D, std=0.2)

    ec = eagle_config("eagle3", hf, set(w), cfg.num_layers)
    head = EagleHead(ec, False, backend="reference")
    hp: dict = {"embedding": params["embedding"]}

    def put(path, array, dtype):
        node = hp
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(array, dtype or jnp.float32)
    read_head_weights(ec, lambda n: w[n].numpy(), set(w), "test", put)
    variables = {"params": hp, "constants": model_constants(head, 64)}

    with torch.no_grad():
        taps = hf_model(torch.tensor([IDS]),
                        output_hidden_states=True).hidden_states
    taps = torch.cat([taps[0][0], taps[1][0], taps[1][0]], -1)
    input_ids, positions, md, num_pages = _batch(IDS)
    kv = init_kv_pages(1, num_pages, B, K, H, np.float32)
    features = head.apply(variables, jnp.asarray(taps.numpy()),
                          method="combine")
    got, _ = head.apply(variables, input_ids, positions, kv, md, features)
    got_ids = head.apply(variables, got, method="draft_ids")

    embeds = torch.tensor(np.asarray(params["embedding"]))[torch.tensor(IDS)]
    want, want_ids = eagle3_reference(w, hf, embeds, taps,
                                      torch.tensor(positions))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=2e-5,
                               rtol=1e-4)
    assert np.asarray(got_ids).tolist() == want_ids.tolist()
    assert set(want_ids.tolist()) <= set(targets.tolist())
