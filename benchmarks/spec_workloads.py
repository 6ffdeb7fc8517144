"""The workloads of `spec_decode_bench.py` (its docstring says what each
is): the prompts, the shaped dummy target shared by draft_model and the
EAGLE heads, the heads built from the target's drawn weights, and the
n-gram workload's target and cycle prompts."""

from __future__ import annotations

import json
import os
import random
import tempfile
import time

EAGLE3_DRAFT_VOCAB = 32000  # as the published EAGLE-3 heads for Llama 3
# The draft_model / EAGLE target (dummy weights, `shape_target`):
# embedding rows of this RMS, and lm_head columns of ids outside the
# EAGLE-3 draft vocabulary times OUTSIDE_DRAFT_VOCAB (its greedy tokens
# fall inside). EAGLE3_HIDDEN_NORM: the EAGLE-3 head's hidden_norm weight
# (its residual's share of the feature, small beside the embedding).
EMBED_RMS = 0.02
OUTSIDE_DRAFT_VOCAB = 0.5
EAGLE3_HIDDEN_NORM = 1e-4
NGRAM_ROUNDS = 6  # rounds of start tokens tried for the n-gram prompts


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Token-id prompts of ``length`` that repeat a random run of 16-64
    tokens (one run per prompt)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        run = [rng.randrange(100, vocab) for _ in range(rng.randrange(16, 65))]
        out.append((run * (length // len(run) + 1))[:length])
    return out


def draft_folder(ns, layers: int | None = None, name: str = "draft-model"
                 ) -> str:
    """A config folder for the draft: the target's with fewer layers
    (``layers``, default ``--draft-layers``)."""
    path = os.path.join(ns.out, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(ns.model, "config.json")) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = layers or ns.draft_layers
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def input_norm_weight(eps: float) -> float:
    """The first input norm's weight that gives an embedding row of RMS
    EMBED_RMS back as it is (tests/tiny_models.py's EAGLE_INPUT_NORM)."""
    return (EMBED_RMS ** 2 + eps) ** 0.5


def draft_vocab_ids(cfg, seed: int):
    """The EAGLE-3 draft vocabulary (EAGLE3_DRAFT_VOCAB target ids drawn
    from ``seed``, in order), or None: the target's whole vocabulary (a
    target whose lm_head is its embedding table)."""
    import numpy as np
    if cfg.tie_word_embeddings or cfg.vocab_size <= EAGLE3_DRAFT_VOCAB:
        return None
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(cfg.vocab_size, EAGLE3_DRAFT_VOCAB,
                              replace=False))


def shape_target(params: dict, cfg, ids) -> dict:
    """The draft_model / EAGLE target's weights (dummy) from the drawn ones,
    in place, as tests/tiny_models.py's make_eagle_target: embedding rows
    of RMS EMBED_RMS and the first input norm's weight `input_norm_weight`,
    so that norm gives the embedding back (a head that reads it without
    a norm sees what the target's first layer sees; that layer's
    attention then reads rows of RMS 0.02, not 1, and adds little, so its
    MLP over the current token decides most of its output); and lm_head
    columns outside ``ids`` times OUTSIDE_DRAFT_VOCAB. Returns {id(old
    leaf): new leaf} for drafters that share a leaf."""
    import jax
    import jax.numpy as jnp
    f32 = jnp.float32
    new = {}

    def put(tree, key, value):
        old = tree[key]
        tree[key] = jax.device_put(value.astype(old.dtype), old.sharding)
        new[id(old)] = tree[key]
    e = params["embedding"].astype(f32)
    put(params, "embedding",
        e * (EMBED_RMS / jnp.sqrt(jnp.mean(e * e, -1, keepdims=True))))
    norm = params["layers_0"]["input_layernorm"]
    put(norm, "scale", jnp.full(norm["scale"].shape,
                                input_norm_weight(cfg.rms_norm_eps), f32))
    if ids is not None and "lm_head" in params:
        old = params["lm_head"]
        params["lm_head"] = lm_head_outside(old, ids, OUTSIDE_DRAFT_VOCAB)
        new[id(old)] = params["lm_head"]
    return new


def lm_head_outside(lm_head, ids, factor: float):
    """lm_head [D, V] with the columns of ids not in ``ids`` times
    ``factor``, in its dtype and sharding."""
    import jax
    import jax.numpy as jnp
    keep = jnp.zeros(lm_head.shape[1], bool).at[jnp.asarray(ids)].set(True)
    w = lm_head.astype(jnp.float32)
    return jax.device_put(jnp.where(keep, w, w * factor).astype(lm_head.dtype),
                          lm_head.sharding)


def shape_engine(engine, ids) -> None:
    """`shape_target` on the engine's target, and on its drafter: a draft
    model's own weights alike; an EAGLE head's leaves shared with the
    target (embedding, EAGLE-1's lm_head) replaced by the shaped ones."""
    import jax

    from jaxinfer.spec_decode.draft_model import DraftModel
    runner = engine.runner
    new = shape_target(runner.params, runner.cfg, ids)
    draft = getattr(runner, "draft", None)
    if draft is None:
        return
    if isinstance(draft, DraftModel):  # the target's first layers
        shape_target(draft.params, draft.cfg, ids)
    else:
        draft.params = jax.tree_util.tree_map(
            lambda x: new.get(id(x), x), draft.params)


def hf_tensors(params: dict, cfg) -> dict:
    """The target's first layer, final norm and lm_head (``params`` of a
    one-layer model), fetched to the host at once, in HF names and layout."""
    import math

    import jax
    import numpy as np

    from jaxinfer.models.llama import decoder_weights
    from jaxinfer.models.spec import LinearLayout
    specs = [s for s in decoder_weights(cfg)
             if s.hf_name.startswith(("model.layers.0.", "model.norm.",
                                      "lm_head."))]

    def leaf(path):
        node = params
        for key in path:
            node = node[key]
        return node
    host = jax.device_get([leaf(s.path) for s in specs])
    out = {}
    for spec, w in zip(specs, host):
        w = np.asarray(w)
        if isinstance(spec.convert, LinearLayout):  # ours: in + out shape
            c = spec.convert
            w = w.reshape(math.prod(c.in_shape), math.prod(c.out_shape)).T
        elif spec.hf_name == "lm_head.weight":  # ours: [D, V]
            w = w.T
        assert w.shape == tuple(spec.hf_shape), (spec.hf_name, w.shape)
        out[spec.hf_name] = w
    return out


def eagle_folder(ns, method: str) -> tuple[str, dict]:
    """An EAGLE head (``method`` "eagle" or "eagle3") that computes the
    target's first layer at the next token, in vLLM's checkpoint layout
    and the target's dtype, built as tests/tiny_models.py's make_eagle
    builds one from the target's weights as `shape_target` leaves them:
    that layer decides the target's tokens while its later layers are
    scaled down, so the head drafts what the target says about as often
    as the draft_model does. The weights are those the engine draws for
    the target (`random_params` draws each param from its name: a
    one-layer config gives the first layer, embeddings and head),
    fetched to the host once; `head_vs_target` checks them in the engine.

    - EAGLE-1 (a trained head's shapes): fc [D, 2D] passes the token's
      embedding through (zeros on the feature) to the target's first
      layer without its input norm (which gives the embedding back).
    - EAGLE-3: the residual entering the layer is the feature
      (hidden_norm's output, norm_before_residual, weight
      EAGLE3_HIDDEN_NORM), not the embedding; so the attention has 2N
      heads of D / N (MHA): N are the target's (its k/v heads repeated),
      N copy the token's own embedding into the residual (q = k = the
      normed embedding times 8 / its RMS: each attends to itself alone; v
      and o_proj identities). q/k/v read only the embeddings (zeros on
      the feature half); fc [D, 3D] is random; norm is the target's final
      norm, lm_head the target's columns at the draft vocabulary
      (`draft_vocab_ids`), d2t their offsets.

    Returns (folder, what the JSON records about the head)."""
    import gc

    import jax
    import numpy as np
    from safetensors.numpy import save_file

    from jaxinfer.models import model_class, resolve_dtype, resolve_model
    from jaxinfer.models.dummy import random_params
    one = draft_folder(ns, layers=1, name="eagle-target-layer0")
    files = resolve_model(one, "dummy")
    cfg = files.config
    dtype = resolve_dtype(ns.dtype, cfg)
    t0 = time.perf_counter()
    params = random_params(model_class(cfg.architecture)(cfg, dtype=dtype),
                           cfg, dtype, seed=engine_seed(ns))
    ids = draft_vocab_ids(cfg, ns.seed)
    shape_target(params, cfg, ids)
    w = hf_tensors(params, cfg)
    del params
    gc.collect()
    fetched = time.perf_counter() - t0
    f32 = np.float32
    D, V = cfg.hidden_size, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layer = {k[len("model.layers.0."):]: v.astype(f32) for k, v in w.items()
             if k.startswith("model.layers.0.")}
    # Weights stay out of the results folder (a GPU call brings that back).
    path = os.path.join(tempfile.gettempdir(), "spec-decode-bench",
                        f"{method}-head")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(ns.model, "config.json")) as f:
        hf = json.load(f)
    L, hf["num_hidden_layers"] = hf["num_hidden_layers"], 1
    out = {}
    if method == "eagle":
        hf["architectures"] = ["LlamaForCausalLM"]
        from tests.tiny_models import eagle1_tensors
        out.update(eagle1_tensors(layer))
        info = {"layout": "vLLM EAGLE-1: fc [D, 2D], layers.0 without "
                "input_layernorm, the target's embedding and lm_head",
                "differences_from_a_trained_head": "none in shapes"}
    else:
        if N * H != D:
            raise ValueError(f"an EAGLE-3 head of copying heads needs "
                             f"heads x head_dim = hidden ({N} x {H} != {D})")
        draft_vocab = V if ids is None else len(ids)
        # vLLM's default taps (2, L // 2, L - 3), kept inside small targets.
        taps = [min(2, L - 1), L // 2, max(L - 3, 0)]
        hf.update(architectures=["LlamaForCausalLMEagle3"],
                  num_attention_heads=2 * N, num_key_value_heads=2 * N,
                  head_dim=H, draft_vocab_size=draft_vocab,
                  norm_before_residual=True,
                  eagle_aux_hidden_state_layer_ids=taps)
        from tests.tiny_models import eagle3_midlayer
        out.update(eagle3_midlayer(layer, N, K, H,
                                   input_norm_weight(cfg.rms_norm_eps),
                                   EAGLE3_HIDDEN_NORM))
        rng = np.random.default_rng(ns.seed)
        out["fc.weight"] = rng.normal(0.0, 0.02, (D, 3 * D)).astype(f32)
        out["norm.weight"] = w["model.norm.weight"].astype(f32)
        rows = np.arange(V) if ids is None else ids
        out["lm_head.weight"] = w["lm_head.weight"][rows].astype(f32)
        out["d2t"] = (rows - np.arange(len(rows))).astype(np.int64)
        out["t2d"] = np.isin(np.arange(V), rows)
        info = {"layout": "vLLM EAGLE-3: midlayer (q/k/v over 2D), fc "
                "[D, 3D], norm, lm_head over the draft vocabulary, d2t, t2d",
                "taps": taps, "hidden_norm_weight": EAGLE3_HIDDEN_NORM,
                "draft_vocab_size": draft_vocab,
                "draft_vocab": ("the target's vocabulary (lm_head tied to "
                                "the embeddings)" if ids is None else
                                f"{draft_vocab} target ids drawn from the "
                                "seed; the target's lm_head columns of the "
                                f"others times {OUTSIDE_DRAFT_VOCAB}"),
                "differences_from_a_trained_head": (
                    f"attention of {2 * N} query and {2 * N} kv heads "
                    f"(a trained head: {N} and {K}): {N} heads copy the "
                    "token's embedding into the residual; q/k/v "
                    f"[{2 * N * H}, {2 * D}], o_proj [{D}, {2 * N * H}]")}
    # The target's dtype (bf16 on a GPU: the values as drawn); contiguous,
    # since safetensors.numpy writes a transposed view's buffer as it lies.
    store = np.dtype(jax.numpy.dtype(dtype))
    out = {k: np.ascontiguousarray(v.astype(store) if v.dtype == f32 else v)
           for k, v in out.items()}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
    save_file(out, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    info.update(folder=path, build_seconds=time.perf_counter() - t0,
                draw_and_fetch_seconds=fetched,
                shapes={k: list(v.shape) for k, v in out.items()})
    return path, info


def head_vs_target(engine, method: str) -> float:
    """The largest difference between the loaded head's layer and the
    target's first layer where the head holds it (EAGLE-3: the first N
    heads on the embedding half, k/v repeated per query head)."""
    import jax.numpy as jnp

    from jaxinfer.models.fused_qkv import FUSED, split
    head = engine.runner.draft.params["layer"]
    target = engine.runner.params["layers_0"]
    if FUSED in target["self_attn"]:  # the target's one q/k/v weight
        q, k, v = split(target["self_attn"][FUSED]["kernel"],
                        engine.runner.cfg.num_heads)
        target = {**target, "self_attn": {
            **target["self_attn"], "q_proj": {"kernel": q},
            "k_proj": {"kernel": k}, "v_proj": {"kernel": v}}}
    worst = 0.0
    for block, names in (("self_attn", ("q_proj", "k_proj", "v_proj",
                                        "o_proj")),
                         ("mlp", ("gate_proj", "up_proj", "down_proj"))):
        for name in names:
            h = head[block][name]["kernel"].astype(jnp.float32)
            t = target[block][name]["kernel"].astype(jnp.float32)
            if method == "eagle3" and name == "o_proj":
                h = h[:t.shape[0]]
            elif method == "eagle3" and block == "self_attn":
                D, n = t.shape[0], head[block]["q_proj"]["kernel"].shape[1]
                t = jnp.repeat(t, n // 2 // t.shape[1], axis=1)
                h = h[:D, :n // 2]
            worst = max(worst, float(jnp.max(jnp.abs(h - t))))
    return worst


def engine_seed(ns) -> int:
    """The engine's seed (its dummy weights' draws)."""
    for pair in ns.engine:
        key, _, value = pair.partition("=")
        if key == "seed":
            return int(value)
    from jaxinfer.config import EngineArgs
    return EngineArgs.seed


def scale_later_layers(engine, first: int, factor: float, originals: dict):
    """The target's layers from ``first`` on: o_proj and down_proj set to
    ``factor`` times their drawn values (kept in ``originals``)."""
    import jax
    params = engine.runner.params
    for name in params:
        if not name.startswith("layers_") or int(name[7:]) < first:
            continue
        for block, proj in (("self_attn", "o_proj"), ("mlp", "down_proj")):
            key = (name, block, proj)
            leaf = params[name][block][proj]
            originals.setdefault(key, leaf)
            params[name][block][proj] = jax.tree_util.tree_map(
                lambda x: (x * factor).astype(x.dtype), originals[key])


def ngram_vocab_ids(ns, vocab: int):
    """The ids the n-gram workload's target emits: 8 * prompt_len of the
    vocabulary, drawn from the seed (None: all of it)."""
    import numpy as np
    size = 8 * ns.prompt_len
    if size >= vocab:
        return None
    rng = np.random.default_rng(ns.seed + 3000)
    return np.sort(rng.choice(vocab, size, replace=False))


def ngram_target(engine, ns) -> dict:
    """The n-gram workload's target (dummy weights), in place: every
    layer's o_proj times ``--ngram-attention-scale`` (its next token then
    depends almost on the current token alone, so its greedy path falls
    into a cycle), and lm_head columns outside `ngram_vocab_ids` times
    OUTSIDE_DRAFT_VOCAB. A map over V tokens at random cycles after about
    sqrt(pi V / 2) tokens (450 at V = 128256, longer than a 512-token
    prompt holds twice); over 8 * prompt_len ids after about 1.25 *
    sqrt(8 * prompt_len) (80 at 512)."""
    import jax
    params = engine.runner.params
    for name in params:
        if name.startswith("layers_"):
            attn = params[name]["self_attn"]
            attn["o_proj"] = jax.tree_util.tree_map(
                lambda x: (x * ns.ngram_attention_scale).astype(x.dtype),
                attn["o_proj"])
    cfg = engine.runner.cfg
    ids = ngram_vocab_ids(ns, cfg.vocab_size)
    if ids is not None and "lm_head" in params:
        params["lm_head"] = lm_head_outside(params["lm_head"], ids,
                                            OUTSIDE_DRAFT_VOCAB)
    else:
        ids = None
    return {"attention_scale": ns.ngram_attention_scale,
            "emitted_vocab": cfg.vocab_size if ids is None else len(ids),
            "outside_lm_head_scale": None if ids is None
            else OUTSIDE_DRAFT_VOCAB}


def find_period(seq: list[int], max_period: int) -> tuple[int, int]:
    """(P, n): the smallest period P <= ``max_period`` whose last 2P tokens
    of ``seq`` are one run of P twice, and the length n of seq's longest
    suffix of period P; (0, 0) when there is none."""
    N = len(seq)
    for P in range(1, min(max_period, N // 2) + 1):
        if seq[N - P:] == seq[N - 2 * P:N - P]:
            n = 2 * P
            while n < N and seq[N - 1 - n] == seq[N - 1 - n + P]:
                n += 1
            return P, n
    return 0, 0


def cycle_prompts(llm, ns, rows: int, vocab: int) -> dict:
    """The n-gram workload's prompts: ``rows`` stretches of the model's own
    greedy output, each a start token (a different one per row) and the
    ``--prompt-len`` - 1 tokens the engine generates after it, kept when
    they end in a cycle of period <= prompt_len / 2 seen at least twice
    (``--ngram-min-cycle`` the shortest period kept). Start tokens are
    drawn in rounds (twice the rows still missing, NGRAM_ROUNDS at most);
    rows still missing then repeat the prompts found. The continuation of
    such a prompt goes round the cycle: text the prompt already holds."""
    from jaxinfer import SamplingParams
    rng = random.Random(ns.seed + 2000)
    sp = SamplingParams(temperature=0.0, max_tokens=ns.prompt_len - 1,
                        ignore_eos=True)
    found: list[dict] = []
    tried: set[int] = set()
    t0 = time.perf_counter()
    for _ in range(NGRAM_ROUNDS):
        need = rows - len(found)
        if need <= 0:
            break
        starts: list[int] = []
        while len(starts) < max(2 * need, 8) and len(tried) < vocab - 100:
            t = rng.randrange(100, vocab)
            if t not in tried:
                tried.add(t)
                starts.append(t)
        outs = llm.generate([{"prompt_token_ids": [t]} for t in starts], sp,
                            use_tqdm=False)
        for t, o in zip(starts, outs):
            seq = [t] + list(o.outputs[0].token_ids)
            P, n = find_period(seq, ns.prompt_len // 2)
            if P >= max(1, ns.ngram_min_cycle) and len(found) < rows:
                found.append({"start": t, "cycle": P, "periodic_suffix": n,
                              "prompt": seq})
    if not found:
        raise RuntimeError(
            f"no start token of {len(tried)} led to a cycle of at most "
            f"{ns.prompt_len // 2} tokens (at least {ns.ngram_min_cycle}) "
            f"within {ns.prompt_len} tokens: lower --ngram-attention-scale")
    return {"prompts": [found[i % len(found)]["prompt"] for i in range(rows)],
            "rows_found": len(found), "rows": rows,
            "start_tokens_tried": len(tried),
            "cycle_lengths": [f["cycle"] for f in found],
            "periodic_suffix_lengths": [f["periodic_suffix"] for f in found],
            "seconds": time.perf_counter() - t0}


def ngram_prompts(llm, ns, vocab: int) -> dict:
    """`cycle_prompts` for the largest batch (a batch of S rows takes the
    first S), made once per bench run by the first engine that needs them
    (the plain one) and read by the other from ``ngram-prompts.json``."""
    path = os.path.join(ns.out, "ngram-prompts.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    made = cycle_prompts(llm, ns, max(ns.batch_sizes), vocab)
    made["made_by"] = ns.child
    with open(path, "w") as f:
        json.dump(made, f)
    return made


def workload_of(ns, which: str) -> str:
    """The target and prompts an engine runs: "ngram" (dummy weights: the
    n-gram workload's, for the ngram engine and its plain one) or
    "layers" (every other engine; with dummy weights the target whose
    later layers are scaled)."""
    ngram = which in ("ngram", "plain-ngram")
    return "ngram" if ngram and ns.load_format == "dummy" else "layers"
