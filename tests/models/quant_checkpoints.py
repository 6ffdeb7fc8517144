"""Tiny quantized HF checkpoints written by the tests themselves.

The packing here is written from the formats' public descriptions, word by
word in plain loops, independently of the loaders' vectorized unpacking
(``jaxinfer/models/quantization/packing.py``):

- AutoAWQ GEMM: ``qweight`` int32 [in, out / 8]; output column ``8c +
  ORDER[i]`` of input row r sits in bits 4i..4i+3 of word [r, c], ORDER =
  0, 2, 4, 6, 1, 3, 5, 7. ``qzeros`` int32 [in / group, out / 8] alike;
  ``scales`` f16 [in / group, out]; w = (q - z) * s.
- AutoGPTQ: ``qweight`` int32 [in * bits / 32, out]; input row ``(32 / bits)
  * r + j`` of column c sits in bits ``bits * j ..`` of word [r, c].
  ``qzeros`` int32 [groups, out * bits / 32] packs consecutive columns the
  same way, storing zero - 1 (v1); ``scales`` f16 [groups, out]; ``g_idx``
  int32 [in], the group of each input row (a permutation of the groups in
  act order, desc_act); w[i] = (q[i] - z[g_idx[i]]) * s[g_idx[i]].

Each writer returns the dequantized weights it encoded ([out, in] f32,
computed here in NumPy) by HF tensor name, the reference the loaded params
must equal exactly.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
from safetensors.numpy import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight",
                   "o_proj.weight", "gate_proj.weight", "up_proj.weight",
                   "down_proj.weight")


def rtn_asymmetric(w: np.ndarray, bits: int, group: int):
    """Round-to-nearest asymmetric quantization of w [out, in] per group of
    ``group`` inputs: (codes [out, in], zeros [out, G], f16 scales [out, G])."""
    out, n_in = w.shape
    qmax = (1 << bits) - 1
    g = w.reshape(out, n_in // group, group).astype(np.float32)
    lo, hi = g.min(-1), g.max(-1)
    scale = np.maximum((hi - lo) / qmax, 1e-6).astype(np.float16)
    s32 = scale.astype(np.float32)
    zero = np.clip(np.round(-lo / s32), 0, qmax).astype(np.int64)
    codes = np.clip(np.round(g / s32[..., None]) + zero[..., None], 0, qmax)
    return codes.astype(np.int64).reshape(out, n_in), zero, scale


def _pack_columns(codes: np.ndarray, bits: int, order=None) -> np.ndarray:
    """codes [rows, cols] -> int32 [rows, cols * bits / 32], packing
    consecutive columns (field i of word c = column c * per + order[i])."""
    per = 32 // bits
    rows, cols = codes.shape
    order = order or tuple(range(per))
    words = np.zeros((rows, cols // per), np.uint32)
    for c in range(cols // per):
        for i in range(per):
            words[:, c] |= codes[:, c * per + order[i]].astype(np.uint32) << (
                bits * i)
    return words.view(np.int32)


def _pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [rows, cols] -> int32 [rows * bits / 32, cols], packing
    consecutive rows (field j of word r = row r * per + j)."""
    per = 32 // bits
    rows, cols = codes.shape
    words = np.zeros((rows // per, cols), np.uint32)
    for r in range(rows // per):
        for j in range(per):
            words[r] |= codes[r * per + j].astype(np.uint32) << (bits * j)
    return words.view(np.int32)


def _copy_folder(src: str, dst: str) -> dict:
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), dst)
    tensors = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, name)))
    return tensors


def _write(dst: str, tensors: dict, quantization_config: dict | None,
           config_file: str | None = None):
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    if quantization_config is not None:
        if config_file is None:
            cfg["quantization_config"] = quantization_config
        else:  # an older export: the config in a file of its own
            with open(os.path.join(dst, config_file), "w") as f:
                json.dump(quantization_config, f)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)


# Mixtral's experts: w1 (gate), w3 (up), w2 (down).
MIXTRAL_EXPERT_SUFFIXES = ("w1.weight", "w2.weight", "w3.weight")


def write_awq(src: str, dst: str, group: int = 32, skip=(),
              suffixes=LINEAR_SUFFIXES):
    """An AutoAWQ (GEMM, 4-bit) checkpoint of the float model in ``src``:
    the tensors named ``*<suffix>`` quantized, except those whose name
    contains one of ``skip`` (modules_to_not_convert)."""
    tensors = _copy_folder(src, dst)
    reference = {}
    for name in list(tensors):
        if not name.endswith(suffixes) or any(s in name for s in skip):
            continue
        w = tensors.pop(name)
        codes, zero, scale = rtn_asymmetric(w, 4, group)
        prefix = name[:-len("weight")]
        tensors[prefix + "qweight"] = _pack_columns(codes.T, 4, AWQ_ORDER)
        tensors[prefix + "qzeros"] = _pack_columns(zero.T, 4, AWQ_ORDER)
        tensors[prefix + "scales"] = scale.T.copy()
        rep = np.repeat
        reference[name] = ((codes - rep(zero, group, 1)).astype(np.float32)
                           * rep(scale.astype(np.float32), group, 1))
    _write(dst, tensors, {"quant_method": "awq", "bits": 4,
                          "group_size": group, "zero_point": True,
                          "version": "gemm",
                          "modules_to_not_convert": list(skip) or None})
    return reference


def write_gptq(src: str, dst: str, bits: int = 4, group: int = 32,
               desc_act: bool = False, seed: int = 0, v2: bool = False,
               config_file: str | None = None, suffixes=LINEAR_SUFFIXES):
    """An AutoGPTQ checkpoint (the tensors named ``*<suffix>`` quantized);
    with ``desc_act`` the input rows are given groups in a random order
    (as act-order quantization does)."""
    rng = np.random.default_rng(seed)
    tensors = _copy_folder(src, dst)
    reference = {}
    for name in list(tensors):
        if not name.endswith(suffixes):
            continue
        w = tensors.pop(name)
        out, n_in = w.shape
        order = rng.permutation(n_in) if desc_act else np.arange(n_in)
        # Quantize in act order: the k-th row of ``order`` is in group k //
        # group, so g_idx[order[k]] = k // group.
        codes_o, zero, scale = rtn_asymmetric(w[:, order], bits, group)
        codes = np.empty_like(codes_o)
        codes[:, order] = codes_o
        g_idx = np.empty(n_in, np.int64)
        g_idx[order] = np.arange(n_in) // group
        prefix = name[:-len("weight")]
        tensors[prefix + "qweight"] = _pack_rows(codes.T, bits)
        stored = zero if v2 else (zero - 1) % (1 << bits)
        tensors[prefix + "qzeros"] = _pack_columns(stored.T, bits)
        tensors[prefix + "scales"] = scale.T.copy()
        tensors[prefix + "g_idx"] = g_idx.astype(np.int32)
        s32 = scale.astype(np.float32)
        if not v2:  # the zero v1 readers use: stored + 1 (0 reads as 16)
            zero = stored + 1
        reference[name] = ((codes - zero[:, g_idx]).astype(np.float32)
                           * s32[:, g_idx])
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group,
          "desc_act": desc_act, "sym": False,
          "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    _write(dst, tensors, qc, config_file)
    return reference


def write_fp8(src: str, dst: str, per_channel: bool = False,
              static: bool = False, input_scale: float = 0.1):
    """An fp8 checkpoint in compressed-tensors' float-quantized layout:
    e4m3 ``weight`` + f32 ``weight_scale`` ([out, 1] per channel, [1] per
    tensor) (+ ``input_scale`` [1] when the activations are static: the
    tiny models' activations stay below 448 times the default)."""
    import ml_dtypes
    tensors = _copy_folder(src, dst)
    reference = {}
    for name in list(tensors):
        if not name.endswith(LINEAR_SUFFIXES):
            continue
        w = tensors.pop(name).astype(np.float32)
        amax = (np.abs(w).max(1, keepdims=True) if per_channel
                else np.abs(w).max().reshape(1))
        scale = (amax / 448.0).astype(np.float32)
        codes = np.clip(w / (scale if per_channel else scale[0]), -448, 448
                        ).astype(ml_dtypes.float8_e4m3fn)
        prefix = name[:-len("weight")]
        tensors[name] = codes
        tensors[prefix + "weight_scale"] = scale
        if static:
            tensors[prefix + "input_scale"] = np.array([input_scale],
                                                       np.float32)
        reference[name] = codes.astype(np.float32) * (
            scale if per_channel else scale[0])
    strategy = "channel" if per_channel else "tensor"
    acts = ({"num_bits": 8, "type": "float", "dynamic": False,
             "strategy": "tensor"} if static else
            {"num_bits": 8, "type": "float", "dynamic": True,
             "strategy": "token"})
    _write(dst, tensors, {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                        "symmetric": True, "dynamic": False},
            "input_activations": acts}},
        "ignore": ["lm_head"]})
    return reference


def write_dequantized(src: str, dst: str, reference: dict) -> None:
    """A float checkpoint of ``src`` with each quantized tensor replaced by
    the weights its codes encode (``reference``, as the writers return
    it): the model a quantized checkpoint means."""
    tensors = _copy_folder(src, dst)
    # (safetensors writes an array's buffer as it lies: C order first)
    tensors.update({name: np.ascontiguousarray(w, np.float32)
                    for name, w in reference.items()})
    _write(dst, tensors, None)
