"""GGUF block encoders written by the tests from llama.cpp's block layouts
(ggml-common.h), and a writer of tiny quantized Llama GGUF files.

Each encoder takes a float matrix [rows, in] and returns (raw bytes [rows,
bytes per row], the weights those bytes decode to, computed in NumPy from
the encoder's own fields by the layout's formula). The quantization itself
is plain round-to-nearest; only the byte layout has to be llama.cpp's.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import load_file

QK_K = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """[...] values -> [..., 2] bytes of little-endian f16."""
    return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(
        x.shape + (2,))


def _blocks(w: np.ndarray, size: int) -> np.ndarray:
    rows, n = w.shape
    return w.astype(np.float32).reshape(rows, n // size, size)


def encode_q8_0(w):
    """d (f16), 32 int8: w = d * q."""
    b = _blocks(w, 32)
    d = (np.abs(b).max(-1) / 127).astype(np.float16)
    d32 = d.astype(np.float32)
    q = np.clip(np.round(b / np.where(d32 > 0, d32, 1)[..., None]), -127, 127
                ).astype(np.int8)
    raw = np.concatenate([_f16_bytes(d), q.view(np.uint8)], -1)
    return raw.reshape(w.shape[0], -1), (q * d32[..., None]).reshape(w.shape)


def _nibbles_32(q):
    """32 codes of a Q4_0/Q4_1 block -> 16 bytes: byte j holds input j (low
    nibble) and input j + 16 (high nibble)."""
    q = q.astype(np.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def encode_q4_0(w):
    """d (f16), 16 bytes: w = d * (q - 8)."""
    b = _blocks(w, 32)
    d = (np.abs(b).max(-1) / 7).astype(np.float16)
    d32 = d.astype(np.float32)
    q = np.clip(np.round(b / np.where(d32 > 0, d32, 1)[..., None]) + 8, 0, 15)
    raw = np.concatenate([_f16_bytes(d), _nibbles_32(q)], -1)
    return raw.reshape(w.shape[0], -1), (
        d32[..., None] * (q - 8).astype(np.float32)).reshape(w.shape)


def encode_q4_1(w):
    """d (f16), m (f16), 16 bytes: w = d * q + m."""
    b = _blocks(w, 32)
    lo, hi = b.min(-1), b.max(-1)
    d = ((hi - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    d32, m32 = d.astype(np.float32), m.astype(np.float32)
    q = np.clip(np.round((b - m32[..., None]) /
                         np.where(d32 > 0, d32, 1)[..., None]), 0, 15)
    raw = np.concatenate([_f16_bytes(d), _f16_bytes(m), _nibbles_32(q)], -1)
    return raw.reshape(w.shape[0], -1), (
        d32[..., None] * q.astype(np.float32) + m32[..., None]).reshape(w.shape)


def _pack_k_scales(sc, mn):
    """Eight 6-bit scales and mins -> 12 bytes: bytes 0-3 hold scales 0-3
    (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for
    the mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and of
    mins 4-7 (high nibble)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    return out


def encode_q4_k(w):
    """Super-blocks of 256: d, dmin (f16), 12 bytes of 6-bit sub-block
    scales/mins, 128 bytes of codes (each 32-byte run: sub-block 2c in the
    low nibbles, 2c + 1 in the high ones); w = d*sc*q - dmin*m."""
    rows, n = w.shape
    b = _blocks(w, QK_K).reshape(rows, n // QK_K, 8, 32)
    lo = np.minimum(b.min(-1), 0)  # mins are subtracted: m >= 0
    scale = (b.max(-1) - lo) / 15
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = ((-lo).max(-1) / 63).astype(np.float16)
    d32, dm32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d32 > 0, d32, 1)[..., None]), 0, 63)
    mn = np.clip(np.round(-lo / np.where(dm32 > 0, dm32, 1)[..., None]), 0, 63)
    s = d32[..., None] * sc.astype(np.float32)
    m = dm32[..., None] * mn.astype(np.float32)
    q = np.clip(np.round((b + m[..., None]) /
                         np.where(s > 0, s, 1)[..., None]), 0, 15)
    qb = q.astype(np.uint8).reshape(rows, -1, 4, 2, 32)
    qs = (qb[..., 0, :] | (qb[..., 1, :] << 4)).reshape(rows, -1, 128)
    raw = np.concatenate([_f16_bytes(d), _f16_bytes(dmin),
                          _pack_k_scales(sc, mn), qs], -1)
    want = s[..., None] * q.astype(np.float32) - m[..., None]
    return raw.reshape(rows, -1), want.reshape(w.shape)


def encode_q6_k(w):
    """Super-blocks of 256: 128 bytes of low 4 bits, 64 of high 2 bits, 16
    int8 sub-block scales, d (f16); input e: half = e // 128, low bits in
    ql[half*64 + e%64] (nibble e%128 // 64), high bits in qh[half*32 + e%32]
    (bits 2*(e%128 // 32)); w = d * sc * (q - 32)."""
    rows, n = w.shape
    b = _blocks(w, QK_K).reshape(rows, n // QK_K, 16, 16)
    scale = np.abs(b).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16)
    d32 = d.astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d32 > 0, d32, 1)[..., None]),
                 -128, 127).astype(np.int8)
    s = d32[..., None] * sc.astype(np.float32)
    q = np.clip(np.round(b / np.where(s > 0, s, 1)[..., None]), -32, 31)
    u = (q + 32).astype(np.uint8).reshape(rows, -1, 2, 4, 32)  # [half, quarter]
    lo, hi = u & 0xF, u >> 4
    ql = (lo[:, :, :, 0:2] | (lo[:, :, :, 2:4] << 4)).reshape(rows, -1, 128)
    qh = (hi[:, :, :, 0] | (hi[:, :, :, 1] << 2) | (hi[:, :, :, 2] << 4)
          | (hi[:, :, :, 3] << 6)).reshape(rows, -1, 64)
    raw = np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], -1)
    want = s[..., None] * q.astype(np.float32)
    return raw.reshape(rows, -1), want.reshape(w.shape)


ENCODERS = {"Q8_0": encode_q8_0, "Q4_0": encode_q4_0, "Q4_1": encode_q4_1,
            "Q4_K": encode_q4_k, "Q6_K": encode_q6_k}

LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm":
         "ffn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj":
         "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj":
         "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}


def _copy_embedded_tokenizer(w) -> None:
    """The embedded SmolLM2 GGUF's byte-level BPE vocabulary (the tiny
    models share its tokenizer)."""
    from jaxinfer.models.embedded import DEFAULT_MODEL, embedded_model_path
    from jaxinfer.models.gguf_loader import open_gguf
    r = open_gguf(embedded_model_path(DEFAULT_MODEL))
    get = lambda k: r.fields[k].contents()
    w.add_tokenizer_model(get("tokenizer.ggml.model"))
    w.add_token_list(get("tokenizer.ggml.tokens"))
    w.add_token_types(get("tokenizer.ggml.token_type"))
    w.add_token_merges(get("tokenizer.ggml.merges"))
    w.add_bos_token_id(get("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(get("tokenizer.ggml.eos_token_id"))
    if "tokenizer.ggml.pre" in r.fields:
        w.add_tokenizer_pre(get("tokenizer.ggml.pre"))


def llama_gguf_writer(path: str, hp: dict, rope_theta: float):
    """A GGUFWriter with a Llama's hyperparameters from its HF config."""
    import gguf
    N = hp["num_attention_heads"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(N)
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_key_length(hp.get("head_dim") or hp["hidden_size"] // N)
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_rope_freq_base(rope_theta)
    w.add_vocab_size(hp["vocab_size"])
    return w


def llama_permute(x, heads):
    """q/k rows in llama.cpp's rotary layout (its LlamaModel.permute)."""
    return (x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:])
            .swapaxes(1, 2).reshape(x.shape))


def write_quantized_llama_gguf(hf_dir: str, path: str, types,
                               tokenizer: bool = False) -> dict:
    """A Llama GGUF of an HF folder's float weights, each linear layer in
    ``types(hf_name)`` (a block type above, or "F32"); q/k rows permuted as
    llama.cpp's converter does; with ``tokenizer``, the embedded model's
    vocabulary too. Returns the weights each quantized layer decodes to,
    [out, in] in HF row order, by HF name."""
    import gguf
    with open(os.path.join(hf_dir, "config.json")) as f:
        hp = json.load(f)
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    N, K = hp["num_attention_heads"], hp["num_key_value_heads"]
    w = llama_gguf_writer(path, hp, hp.get("rope_theta", 10000.0))
    if tokenizer:
        _copy_embedded_tokenizer(w)
    permute = llama_permute

    def unpermute(x, heads):
        return (x.reshape(heads, x.shape[0] // heads // 2, 2, *x.shape[1:])
                .swapaxes(1, 2).reshape(x.shape))

    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    decoded = {}
    for name, x in sd.items():
        x = x.astype(np.float32)
        if name in top:
            w.add_tensor(top[name], x)
            continue
        i, rest = name[len("model.layers."):].split(".", 1)
        part = rest.rsplit(".", 1)[0]
        heads = {"self_attn.q_proj": N, "self_attn.k_proj": K}.get(part)
        if heads:
            x = permute(x, heads)
        gname = f"blk.{i}.{LAYER[part]}.weight"
        kind = types(name) if x.ndim == 2 else "F32"
        if kind == "F32":
            w.add_tensor(gname, x)
            continue
        raw, dec = ENCODERS[kind](x)
        w.add_tensor(gname, raw, raw_dtype=getattr(gguf.GGMLQuantizationType,
                                                   kind))
        decoded[name] = unpermute(dec, heads) if heads else dec
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return decoded
