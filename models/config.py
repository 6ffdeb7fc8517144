"""`ModelConfig`: the one description of a decoder that layers read.

Made from an HF ``config.json`` dict by :func:`model_config_from_hf`; layers never
look at the HF config themselves.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from .errors import ModelConfigError


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling, HF's ``rope_scaling`` / ``rope_parameters``."""
    rope_type: str = "default"  # default | linear | dynamic | llama3 | yarn
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    # llama.cpp's per-frequency divisors (a GGUF's rope_freqs tensor, how
    # Llama 3.1+ GGUF files carry their llama3 scaling): inv_freq / factors.
    freq_factors: tuple[float, ...] | None = None
    # longrope (Phi-3): per-frequency divisors [H/2] for models served
    # within original_max_position_embeddings (short) and past it (long).
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    SUPPORTED = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")

    def __post_init__(self) -> None:
        if self.rope_type not in self.SUPPORTED:
            raise ModelConfigError(
                f"rope_scaling type {self.rope_type!r} is not supported; "
                f"supported: {', '.join(self.SUPPORTED)}")
        if self.factor <= 0:
            raise ModelConfigError(
                f"rope_scaling factor must be > 0, got {self.factor}")
        if self.rope_type == "longrope" and (
                self.short_factor is None or self.long_factor is None
                or self.original_max_position_embeddings is None):
            raise ModelConfigError(
                "longrope scaling needs short_factor, long_factor and "
                "original_max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """How a model takes images: each image is preprocessed to
    ``image_size`` square pixels and becomes ``tokens_per_image``
    embeddings, which stand in for as many ``token_id`` placeholders in the
    prompt."""
    token_id: int  # the image placeholder token (HF's image_token_index)
    tokens_per_image: int
    image_size: int
    num_channels: int = 3


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_layers: int  # L
    num_heads: int  # N
    num_kv_heads: int  # K
    head_dim: int  # H
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over head_dim of q and k (Qwen3)
    sliding_window: int | None = None  # Mistral; None = full attention
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # the checkpoint's own dtype (HF torch_dtype)
    # How the linear layers are quantized (quantization/config.py's
    # QuantizationConfig), None for float weights; set by the loader.
    quantization: Any = None
    # q, k and v as one weight [D, K, G + 2, H] (fused_qkv.py): set by the
    # engine where it applies (``with_fused_qkv``); a checkpoint's own
    # config keeps them separate, as checkpoints store them.
    fused_qkv: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size",
                     "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(
                    f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_kv_heads})")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ModelConfigError(
                f"sliding_window must be > 0 or None, got {self.sliding_window}")
        for name in ("freq_factors", "short_factor", "long_factor"):
            factors = getattr(self.rope_scaling, name)
            if factors is not None and len(factors) != self.head_dim // 2:
                raise ModelConfigError(
                    f"rope {name} has {len(factors)} entries; head_dim "
                    f"{self.head_dim} needs {self.head_dim // 2}")
        if self.hidden_act not in ("silu", "gelu", "gelu_pytorch_tanh"):
            raise ModelConfigError(
                f"hidden_act {self.hidden_act!r} is not supported; "
                "supported: silu, gelu, gelu_pytorch_tanh")

    @property
    def image_input(self) -> ImageInput | None:
        """None: the model takes text only (a multimodal family's config
        says how it takes images)."""
        return None

    @property
    def num_params(self) -> int:
        """Parameters in the checkpoint, as the architecture's spec counts
        them."""
        from .registry import model_spec
        return model_spec(self.architecture).num_params(self)


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling]:
    # transformers >= 5 writes `rope_parameters` (theta inside); older
    # checkpoints write `rope_theta` plus an optional `rope_scaling` dict.
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = merged.pop("rope_type", merged.pop("type", "default"))
    if rope_type == "su":  # Phi-3's first name for longrope
        rope_type = "longrope"
    fields = {f.name for f in dataclasses.fields(RopeScaling)}
    kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
              for k, v in merged.items() if k in fields and v is not None}
    return theta, RopeScaling(rope_type=rope_type, **kwargs)


def _sliding_window(hf: dict[str, Any]) -> int | None:
    window = hf.get("sliding_window")
    if window is None:
        return None
    # Qwen2/Qwen3 carry a window that is off unless use_sliding_window is set.
    if "use_sliding_window" in hf and not hf["use_sliding_window"]:
        return None
    return int(window)


def model_config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Builds a ModelConfig from a parsed HF ``config.json``, through the
    registered spec of its architecture."""
    from .registry import find_spec
    spec = find_spec(hf.get("architectures") or [], hf.get("model_type"))
    try:
        return spec.config_from_hf(hf)
    except KeyError as e:
        raise ModelConfigError(f"config.json lacks the field {e.args[0]!r}") from e


def decoder_config_from_hf(hf: dict[str, Any], architecture: str,
                           config_cls: type[ModelConfig] = ModelConfig,
                           **family_fields: Any) -> Any:
    """The fields every HF decoder config names alike; ``family_fields``
    set the ones a family decides itself (HF classes that hard-code a
    choice, such as Qwen3's q/k norm, write no field for it) or its own
    ``config_cls`` (a ModelConfig subclass) adds."""
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    theta, rope = _rope_from_hf(hf)
    eos = hf.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (
        (eos,) if eos is not None else ())
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    fields: dict[str, Any] = dict(
        architecture=architecture,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden // num_heads),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=rope,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        sliding_window=_sliding_window(hf),
        hidden_act=hf.get("hidden_act", "silu"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(int(e) for e in eos_ids),
        dtype=str(dtype),
    )
    fields.update(family_fields)
    return config_cls(**fields)


def load_hf_config(model_dir: str) -> dict[str, Any]:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ModelConfigError(f"{path} does not exist: a model folder needs "
                               "an HF config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from e
