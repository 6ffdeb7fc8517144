"""Tiny embedding models for the pooling tests: a tiny random HF decoder
folder with sentence-transformers' files written beside it, and the
reference pooling computed from HF transformers' own hidden states (as
sentence-transformers pools them: its Pooling module over the transformer's
last hidden state, then its Normalize module)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

ST_FLAGS = {"LAST": "pooling_mode_lasttoken", "MEAN": "pooling_mode_mean_tokens",
            "CLS": "pooling_mode_cls_token"}


def make_embedder(src: str, dst: str, pooling: str | None, normalize: bool,
                  **config_extra) -> str:
    """A copy of the model folder ``src`` at ``dst``; with ``pooling`` (a
    key of ST_FLAGS) sentence-transformers' modules.json and
    1_Pooling/config.json (and its Normalize module when ``normalize``);
    ``config_extra`` keys are added to config.json."""
    shutil.copytree(src, dst)
    if config_extra:
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg.update(config_extra)
        with open(path, "w") as f:
            json.dump(cfg, f)
    if pooling is None:
        return dst
    with open(os.path.join(dst, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(dst, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(dst, "1_Pooling"))
    pool_cfg = {"word_embedding_dimension": hidden,
                **{flag: name == pooling for name, flag in ST_FLAGS.items()}}
    with open(os.path.join(dst, "1_Pooling", "config.json"), "w") as f:
        json.dump(pool_cfg, f)
    return dst


def hf_embeddings(path: str, prompts: list[list[int]], pooling: str,
                  normalize: bool) -> list[np.ndarray]:
    """Each prompt's embedding from HF transformers in float32: the base
    model's last hidden state (final norm included), pooled one prompt at
    a time (no padding), then L2-normalized when asked."""
    import torch
    from transformers import AutoModel
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            h = model(torch.tensor([ids])).last_hidden_state[0]  # [T, D]
            v = {"LAST": h[-1], "MEAN": h.mean(0), "CLS": h[0]}[pooling]
            if normalize:
                v = torch.nn.functional.normalize(v, p=2, dim=0)
            out.append(v.numpy())
    return out
