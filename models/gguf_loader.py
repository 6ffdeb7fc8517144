"""GGUF files (llama.cpp's format), read with the ``gguf`` package.

Quantized tensors are dequantized on the host (to float32, then the requested
dtype). llama.cpp's converter permutes the rows of Llama-family q/k projections
for its interleaved rotary layout; we undo that so the weights match HF's
rotate-half convention. The model config is rebuilt from the file's metadata;
the tokenizer and chat template also live there (see ``jaxinfer.tokenizer``).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import numpy as np

from .errors import CheckpointError
from .registry import gguf_spec, supported_gguf_architectures
from .spec import GGUFNames


def _hf_name(names: GGUFNames, gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor, from the family's name tables."""
    if gguf_name in names.top_names:
        return names.top_names[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(2) in names.layer_names:
        return (f"model.layers.{m.group(1)}."
                f"{names.layer_names[m.group(2)]}.{m.group(3)}")
    return None


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation."""
    # llama.cpp viewed each head's rows as [2, H/2] and stored them as
    # [H/2, 2]; read them back as [H/2, 2] and swap.
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def open_gguf(path: str) -> Any:  # a gguf.GGUFReader
    """A parsed `gguf.GGUFReader`, shared by the weight loader and the
    tokenizer (parsing a 49k-token vocabulary takes seconds); a file
    rewritten in place is parsed again."""
    if not os.path.isfile(path):
        raise CheckpointError(f"GGUF file {path} does not exist")
    st = os.stat(path)
    return _parse_gguf(path, st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=4)
def _parse_gguf(path: str, *_file_identity: int) -> Any:
    import gguf
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct errors
        raise CheckpointError(f"{path} is not a readable GGUF file: {e}") from e


class GGUFReader:
    """``get(hf_name)`` and ``hf_config()`` over one .gguf file."""

    def __init__(self, path: str):
        import gguf
        self._reader = open_gguf(path)
        self.path = path
        self._gguf = gguf
        self.arch = self.field("general.architecture")
        experts = bool(self.field(f"{self.arch}.expert_count"))
        spec = gguf_spec(self.arch, experts)
        if spec is None or spec.gguf is None:
            what = repr(self.arch) + (" with experts" if experts else "")
            raise CheckpointError(
                f"{path}: GGUF architecture {what} is not supported; "
                f"supported: {', '.join(supported_gguf_architectures())}")
        self.spec = spec
        self._names = spec.gguf
        self._tensors = {}
        for t in self._reader.tensors:
            hf = _hf_name(self._names, t.name)
            if hf is not None:
                self._tensors[hf] = t

    def field(self, key: str, default: Any = None) -> Any:
        f = self._reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    def hf_config(self) -> dict:
        """An HF-style config.json dict rebuilt from the metadata."""
        a = self.arch
        get = lambda k, d=None: self.field(f"{a}.{k}", d)
        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        vocab = get("vocab_size") or len(self.field("tokenizer.ggml.tokens"))
        cfg = {
            "architectures": [self.spec.architecture],
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(get("feed_forward_length")),
            "num_hidden_layers": int(get("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(get("attention.head_count_kv", heads)),
            "head_dim": int(get("attention.key_length", hidden // heads)),
            "max_position_embeddings": int(get("context_length", 2048)),
            "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(get("rope.freq_base", 10000.0)),
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "attention_bias": "model.layers.0.self_attn.q_proj.bias" in self._tensors,
            "bos_token_id": self.field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.field("tokenizer.ggml.eos_token_id"),
        }
        experts = get("expert_count")
        if experts:  # a mixture of experts
            # Qwen3-MoE's config names the count num_experts, Mixtral's
            # num_local_experts.
            cfg["num_experts"] = cfg["num_local_experts"] = int(experts)
            cfg["num_experts_per_tok"] = int(get("expert_used_count"))
            cfg["moe_intermediate_size"] = int(get(
                "expert_feed_forward_length", cfg["intermediate_size"]))
        cfg.update(self._names.config_defaults)
        window = get("attention.sliding_window")
        if window:
            cfg["sliding_window"] = int(window)
        scaling = get("rope.scaling.type")
        if scaling and scaling != "none":
            cfg["rope_scaling"] = {
                "rope_type": scaling,
                "factor": float(get("rope.scaling.factor", 1.0)),
                "original_max_position_embeddings": get(
                    "rope.scaling.original_context_length"),
            }
        if self._names.config_fields is not None:
            cfg.update(self._names.config_fields(get, cfg))
        # Llama 3.1+ files carry their llama3 scaling as a tensor of
        # per-frequency divisors, not as metadata.
        freqs = next((t for t in self._reader.tensors
                      if t.name == "rope_freqs.weight"), None)
        if freqs is not None:
            factors = np.asarray(self._gguf.quants.dequantize(
                freqs.data, freqs.tensor_type), np.float32).reshape(-1)
            cfg.setdefault("rope_scaling", {"rope_type": "default"})[
                "freq_factors"] = [float(f) for f in factors]
        return cfg

    def get(self, hf_name: str) -> np.ndarray | None:
        t = self._tensors.get(hf_name)
        if t is None:
            return None
        w = self._gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, dtype=np.float32).reshape(
            tuple(int(d) for d in reversed(t.shape)))
        if self._names.from_stored is not None:
            w = self._names.from_stored(hf_name, w)
        return self._unpermuted(hf_name, w)

    def tensor_type(self, hf_name: str) -> str | None:
        """The GGML type name of a tensor ("Q4_K", "F32", ...)."""
        t = self._tensors.get(hf_name)
        return None if t is None else t.tensor_type.name

    def quantized(self, hf_name: str) -> tuple[str, np.ndarray]:
        """(type name, raw block bytes [rows, bytes per row]) of a matrix,
        rows un-permuted like ``get``'s (a row's blocks move together)."""
        t = self._tensors.get(hf_name)
        if t is None:
            raise CheckpointError(f"{self.path}: tensor {hf_name!r} is missing")
        rows = int(t.shape[-1]) if len(t.shape) > 1 else 1
        raw = np.asarray(t.data, np.uint8).reshape(rows, -1)
        return t.tensor_type.name, self._unpermuted(hf_name, raw)

    def _unpermuted(self, hf_name: str, w: np.ndarray) -> np.ndarray:
        # llama.cpp permutes q/k rows for Llama and Mistral rotary; Qwen is
        # stored unpermuted (its converter skips the permutation).
        if self._names.permuted_qk and hf_name.endswith(
                ("q_proj.weight", "k_proj.weight")):
            heads = int(self.field(f"{self.arch}.attention.head_count"))
            if "k_proj" in hf_name:
                heads = int(self.field(f"{self.arch}.attention.head_count_kv",
                                       heads))
            w = _unpermute(w, heads)
        return w
