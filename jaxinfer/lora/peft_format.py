"""Reads a PEFT LoRA adapter folder into a `LoRAAdapter` in the engine's
slot layout.

PEFT saves ``adapter_config.json`` (rank ``r``, ``lora_alpha``,
``use_rslora``, ``target_modules``, per-module ``rank_pattern`` /
``alpha_pattern``, ...) and ``adapter_model.safetensors`` with, per adapted
layer, ``base_model.model.<HF module>.lora_A.weight`` [r, in] and
``lora_B.weight`` [out, r]; the layer's output gains
``scaling * x A^T B^T`` with ``scaling = alpha / r`` (``alpha / sqrt(r)``
under rsLoRA). Every setting that would change that forward pass in a way
jaxinfer does not run is refused by name (`UnsupportedLoRAAdapterError`),
and so is every tensor that is not such a pair for a layer of this model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
from typing import Any

import jax
import numpy as np

from .errors import (
    LoRAAdapterNotFoundError,
    LoRAError,
    LoRARankError,
    LoRAShapeMismatchError,
    UnknownLoRAModuleError,
    UnsupportedLoRAAdapterError,
)
from .layout import SlotLayout
from .request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_FILE = "adapter_model.bin"
PREFIX = "base_model.model."  # PEFT's wrapper around the HF model
_PAIR = re.compile(r"(.+)\.lora_([AB])\.weight")
# Modules PEFT can adapt that are not linear layers of the decoder.
EMBEDDING_MODULES = ("embed_tokens", "lm_head")

# PEFT settings whose forward pass jaxinfer does not run, with the values
# that mean "off": (what the setting is, accepted values).
UNSUPPORTED_SETTINGS = {
    "use_dora": ("DoRA (weight-decomposed LoRA)", (False, None)),
    "bias": ("trained bias terms (bias='all' or 'lora_only')", ("none", None)),
    "lora_bias": ("a bias on lora_B", (False, None)),
    "fan_in_fan_out": ("Conv1D-layout weights (fan_in_fan_out)", (False, None)),
    "modules_to_save": ("fully trained extra modules (modules_to_save)",
                        (None, [])),
    "trainable_token_indices": ("trainable token embeddings", (None, [], {})),
    "layer_replication": ("layer replication", (None, [])),
    "target_parameters": ("LoRA on raw parameters (target_parameters)",
                          (None, [])),
    "alora_invocation_tokens": ("activated LoRA (aLoRA)", (None, [])),
    "use_qalora": ("QA-LoRA", (False, None)),
    "megatron_config": ("Megatron-parallel LoRA layers", (None,)),
    "arrow_config": ("Arrow routing between adapters", (None,)),
    "use_bdlora": ("block-diagonal LoRA", (None, False)),
    "kasa_config": ("KaSA adapters", (None,)),
    "velora_config": ("VeLoRA adapters", (None,)),
    "monteclora_config": ("MonteCLoRA adapters", (None,)),
}


@dataclasses.dataclass(frozen=True, eq=False)
class LoRAAdapter:
    """A loaded adapter, ready to be copied into a device slot."""
    request: LoRARequest
    # What identifies its weights: the prefix cache keys pages by it and
    # the device slots hold adapters by it (a re-saved folder is new).
    key: tuple
    rank: int  # the largest rank of its modules
    modules: tuple[str, ...]  # HF names of the layers it changes
    # [SlotLayout.size] in the engine dtype: NumPy, or a pinned host array
    # on a GPU (`LoRAPool.stage`).
    flat: Any

    @property
    def lora_int_id(self) -> int:
        return self.request.lora_int_id


def adapter_key(request: LoRARequest) -> tuple | None:
    """What identifies an adapter's weights: its id and name, its folder,
    and its weights file's mtime and size (None: the file is unreadable)."""
    path = request.lora_path
    try:
        stat = os.stat(os.path.join(path, WEIGHTS_FILE))
    except OSError:
        return None
    return (request.lora_int_id, request.lora_name, os.path.realpath(path),
            stat.st_mtime_ns, stat.st_size)


def _fail_if_missing(path: str, request: LoRARequest) -> None:
    """One answer for a path that is not an adapter folder, whatever is
    missing (the folder, its config or its weights): the answer must not
    tell a client which folders exist on the server."""
    if not (os.path.isfile(os.path.join(path, CONFIG_FILE))
            and os.path.isfile(os.path.join(path, WEIGHTS_FILE))):
        raise LoRAAdapterNotFoundError(
            f"No adapter found for LoRA adapter {request.lora_name!r}: the "
            f"lora_path must be a local folder holding {CONFIG_FILE} and "
            f"{WEIGHTS_FILE} (jaxinfer never downloads, and does not read "
            f"PyTorch pickles ({PICKLE_FILE}): save adapters with "
            "safe_serialization=True)")


def read_config(path: str, request: LoRARequest) -> dict:
    try:
        with open(os.path.join(path, CONFIG_FILE)) as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise LoRAError(f"LoRA adapter {request.lora_name!r}: {CONFIG_FILE} "
                        f"is not readable JSON: {e.msg} (line {e.lineno})"
                        ) from None
    except (OSError, UnicodeDecodeError):
        raise LoRAError(f"LoRA adapter {request.lora_name!r}: {CONFIG_FILE} "
                        "is not readable JSON") from None
    if not isinstance(config, dict):
        raise LoRAError(f"LoRA adapter {request.lora_name!r}: {CONFIG_FILE} "
                        "must hold a JSON object")
    name = request.lora_name
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise UnsupportedLoRAAdapterError(
            f"adapter {name!r} is a PEFT {peft_type} adapter; only LoRA "
            "adapters are served")
    for field, (what, off) in UNSUPPORTED_SETTINGS.items():
        value = config.get(field)
        if value not in off:
            raise UnsupportedLoRAAdapterError(
                f"LoRA adapter {name!r} uses {what} ({field}={value!r} in its "
                f"{CONFIG_FILE}), which jaxinfer does not serve")
    r = config.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise LoRAError(f"LoRA adapter {name!r}: {CONFIG_FILE} needs a "
                        f"positive integer rank 'r', got {r!r}")
    alpha = config.get("lora_alpha", r)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoRAError(f"LoRA adapter {name!r}: lora_alpha must be a number, "
                        f"got {alpha!r}")
    return config


def _check_target_modules(config: dict, layout: SlotLayout,
                          request: LoRARequest) -> None:
    """``target_modules`` as a list names modules by their last component
    (or a dotted suffix); a string is a regex PEFT matched when training,
    checked through the tensors instead."""
    targets = config.get("target_modules")
    if not isinstance(targets, (list, tuple)):
        return
    known = layout.short_names
    for name in targets:
        short = str(name).rsplit(".", 1)[-1]
        if short in EMBEDDING_MODULES:
            raise UnsupportedLoRAAdapterError(
                f"LoRA adapter {request.lora_name!r} targets {short}: "
                "adapters on the embeddings or lm_head are not served "
                f"(jaxinfer adapts the linear layers {', '.join(sorted(known))})")
        if short not in known:
            raise UnknownLoRAModuleError(
                f"LoRA adapter {request.lora_name!r} targets {name!r}, which "
                f"this model does not have; its LoRA targets are "
                f"{', '.join(sorted(known))}")


def _pattern_value(patterns: dict | None, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching
    the module name's end (a regex over dotted components)."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


# The dtypes adapters are saved in, by their safetensors names, and sizes.
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def max_header_bytes(layout: SlotLayout) -> int:
    """A generous bound on the JSON header of an adapter of this model:
    two tensor entries per target layer plus metadata."""
    return (1 << 16) + 2 * 512 * len(layout.targets)


def max_weights_bytes(layout: SlotLayout) -> int:
    """The largest weights file an adapter of this model can need: every
    target layer adapted at max_lora_rank, in float32, and its header."""
    return 8 + max_header_bytes(layout) + DTYPE_BYTES["F32"] * layout.size


def read_header(path: str, request: LoRARequest, layout: SlotLayout
                ) -> dict[str, tuple[int, ...]]:
    """The weights file's tensor shapes, from its safetensors header alone
    (8 bytes of header length, then JSON naming each tensor's dtype, shape
    and byte range): a file larger than any adapter of this model, or one
    whose header is malformed, is refused before a tensor is read."""
    name = request.lora_name
    limit = max_weights_bytes(layout)

    def bad(why: str) -> LoRAError:
        return LoRAError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} is not a "
                         f"valid safetensors file ({why})")
    try:
        with open(os.path.join(path, WEIGHTS_FILE), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise LoRAError(
                    f"LoRA adapter {name!r}: {WEIGHTS_FILE} is {size} bytes, "
                    f"more than any adapter of this model needs ({limit} "
                    f"bytes: every target layer at max_lora_rank="
                    f"{layout.rank} in float32): is it an adapter of another "
                    "model, or of a higher rank?")
            head = f.read(8)
            if len(head) < 8:
                raise bad("shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(max_header_bytes(layout), size - 8):
                raise bad(f"a header of {n} bytes")
            header = json.loads(f.read(n))
    except OSError:
        raise LoRAError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} could not "
                        "be read") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    shapes = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(shape, list) or not all(
                isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise bad(f"tensor {key[:200]!r} has no valid shape and offsets")
        dtype = entry.get("dtype")
        if dtype not in DTYPE_BYTES:
            raise LoRAError(
                f"LoRA adapter {name!r}: tensor {key[:200]!r} is {dtype!r}; "
                f"adapter weights are read as {', '.join(DTYPE_BYTES)}")
        begin, end = offsets
        if (not 0 <= begin <= end or 8 + n + end > size
                or end - begin != math.prod(shape) * DTYPE_BYTES[dtype]):
            raise bad(f"tensor {key[:200]!r}: its byte range does not match "
                      "its shape or the file")
        shapes[key] = tuple(shape)
    return shapes


def _read_tensors(path: str, request: LoRARequest) -> dict[str, np.ndarray]:
    from safetensors import safe_open
    file = os.path.join(path, WEIGHTS_FILE)
    try:
        try:
            with safe_open(file, framework="numpy") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except TypeError:  # an older safetensors without NumPy bfloat16
            with jax.default_device(jax.devices("cpu")[0]):
                with safe_open(file, framework="flax") as f:
                    return {k: np.asarray(f.get_tensor(k)) for k in f.keys()}
    except OSError:  # its text names the file
        raise LoRAError(f"LoRA adapter {request.lora_name!r}: {WEIGHTS_FILE} "
                        "could not be read") from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise LoRAError(f"LoRA adapter {request.lora_name!r}: {WEIGHTS_FILE} "
                        f"is not a readable safetensors file: {e}") from None


def _pairs(tensors: dict[str, Any], layout: SlotLayout, request: LoRARequest
           ) -> dict[str, dict[str, Any]]:
    """{HF module: {"A": ..., "B": ...}} of the tensors (or of their
    shapes), refusing every other tensor."""
    name = request.lora_name
    pairs: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        bare = key[len(PREFIX):] if key.startswith(PREFIX) else key
        short = bare.split(".lora_", 1)[0].rsplit(".", 1)[-1]
        if short in EMBEDDING_MODULES or "lora_embedding_" in bare:
            raise UnsupportedLoRAAdapterError(
                f"LoRA adapter {name!r} has weights for {short} ({key}): "
                "adapters on the embeddings or lm_head are not served")
        if "lora_magnitude_vector" in bare:
            raise UnsupportedLoRAAdapterError(
                f"LoRA adapter {name!r} is a DoRA adapter ({key}), which "
                "jaxinfer does not serve")
        m = _PAIR.fullmatch(bare)
        if m is None:
            raise UnsupportedLoRAAdapterError(
                f"LoRA adapter {name!r} holds {key}, which is not a LoRA "
                "A/B weight (bias terms, modules_to_save and other extras are "
                "not served)")
        module, which = m.groups()
        if module not in layout.targets:
            raise UnknownLoRAModuleError(
                f"LoRA adapter {name!r} has weights for {module}, which this "
                f"model does not have (its LoRA targets are "
                f"{', '.join(sorted(layout.short_names))} in layers 0-"
                f"{_num_layers(layout) - 1}): is it an adapter of another "
                "model?")
        pairs.setdefault(module, {})[which] = value
    if not pairs:
        raise LoRAError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} holds no "
                        "LoRA weights")
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise LoRAShapeMismatchError(
                f"LoRA adapter {name!r}: {module} has no {missing} weight")
    return pairs


def _num_layers(layout: SlotLayout) -> int:
    layers = {int(m.group(1)) for m in (re.search(r"\.layers\.(\d+)\.", n)
                                        for n in layout.targets) if m}
    return max(layers) + 1 if layers else 0


def _check_shapes(module: str, a_shape: tuple, b_shape: tuple,
                  layout: SlotLayout, config: dict, name: str) -> int:
    """The pair's rank, once its shapes fit the model's layer, its config
    and max_lora_rank."""
    t = layout.spans[module].target
    r = a_shape[0] if a_shape else 0
    if (len(a_shape) != 2 or len(b_shape) != 2 or a_shape[1] != t.in_features
            or tuple(b_shape) != (t.out_features, r)):
        raise LoRAShapeMismatchError(
            f"LoRA adapter {name!r}: {module} has lora_A {tuple(a_shape)} and "
            f"lora_B {tuple(b_shape)}; this model's layer needs [r, "
            f"{t.in_features}] and [{t.out_features}, r]: is it an "
            "adapter of another model?")
    want = _pattern_value(config.get("rank_pattern"), module, config["r"])
    if r != want:
        raise LoRAShapeMismatchError(
            f"LoRA adapter {name!r}: {module} has rank {r}, but its "
            f"{CONFIG_FILE} says {want} (r / rank_pattern)")
    if r > layout.rank:
        raise LoRARankError(
            f"LoRA adapter {name!r} has rank {r} ({module}), above "
            f"max_lora_rank={layout.rank}: start the engine with "
            f"max_lora_rank >= {r} (--max-lora-rank)")
    return r


def load_peft_adapter(request: LoRARequest, layout: SlotLayout,
                      dtype) -> LoRAAdapter:
    """Reads, checks and converts one adapter (host memory only). Every
    check that the weights file's header allows runs before any tensor
    is read (`read_header`)."""
    path = request.lora_path
    _fail_if_missing(path, request)
    config = read_config(path, request)
    _check_target_modules(config, layout, request)
    name = request.lora_name
    for module, pair in _pairs(read_header(path, request, layout), layout,
                               request).items():
        _check_shapes(module, pair["A"], pair["B"], layout, config, name)
    pairs = _pairs(_read_tensors(path, request), layout, request)
    flat = np.zeros(layout.size, np.float32)
    top_rank = 0
    for module, pair in pairs.items():
        span = layout.spans[module]
        t = span.target
        a, b = pair["A"].astype(np.float32), pair["B"].astype(np.float32)
        # Again on the tensors read: the file may have changed since.
        r = _check_shapes(module, a.shape, b.shape, layout, config, name)
        top_rank = max(top_rank, r)
        alpha = _pattern_value(config.get("alpha_pattern"), module,
                               config.get("lora_alpha", config["r"]))
        scaling = alpha / (math.sqrt(r) if config.get("use_rslora") else r)
        a_slot = np.zeros(span.a_shape, np.float32)
        a_slot[..., :r] = a.T.reshape(t.in_shape + (r,))
        b_slot = np.zeros(span.b_shape, np.float32)
        b_slot[:r] = (b.T * scaling).reshape((r,) + t.out_shape)
        flat[span.a_offset:span.a_offset + a_slot.size] = a_slot.reshape(-1)
        flat[span.b_offset:span.b_offset + b_slot.size] = b_slot.reshape(-1)
    key = adapter_key(request)
    if key is None:  # the folder changed while it was read
        raise LoRAAdapterNotFoundError(
            f"No adapter found for LoRA adapter {name!r}: {WEIGHTS_FILE} "
            "vanished while it was read")
    return LoRAAdapter(request=request, key=key, rank=top_rank,
                       modules=tuple(sorted(pairs)),
                       flat=flat.astype(np.dtype(dtype)))
