"""Random PEFT LoRA adapters for the tiny models, saved as real adapter
folders (``adapter_config.json`` + ``adapter_model.safetensors``) by PEFT
itself, and HF transformers + PEFT as the reference that runs them."""

from __future__ import annotations

import json
import os

import torch

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
              "down_proj"]


def make_peft_adapter(base_path: str, out_path: str, seed: int,
                      std: float = 0.1, **lora_config) -> str:
    """Saves a LoRA adapter of ``base_path`` with random A and B (PEFT's
    init makes B zero, which would hide every mistake in B)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(
        base_path, dtype=torch.float32, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False,
                                                  **lora_config))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, std)
    peft_model.save_pretrained(out_path)
    return out_path


def edit_adapter(src: str, dst: str, config: dict | None = None,
                 tensors=None) -> str:
    """A copy of adapter ``src`` with config keys replaced and the tensor
    dict passed through ``tensors(d) -> d`` (for broken adapters)."""
    from safetensors.torch import load_file, save_file
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg.update(config or {})
    with open(os.path.join(dst, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    weights = load_file(os.path.join(src, "adapter_model.safetensors"))
    if tensors is not None:
        weights = tensors(weights)
    save_file(weights, os.path.join(dst, "adapter_model.safetensors"))
    return dst


def hf_peft_runner(base_path: str, adapter_path: str | None):
    """An ``HfRunner`` (tests/runners.py) whose model runs the adapter
    through PEFT (the base model alone for None)."""
    from tests.runners import HfRunner
    runner = HfRunner(base_path)
    if adapter_path is not None:
        from peft import PeftModel
        runner.model = PeftModel.from_pretrained(runner.model,
                                                 adapter_path).eval()
    return runner


# Three adapters of the tiny Llama that differ in every setting the engine
# reads: rank, alpha, rsLoRA, targets, layers, per-module rank and alpha.
ADAPTERS = {
    "all-r8": dict(seed=1, r=8, lora_alpha=16, target_modules=ALL_LINEAR),
    "qvo-r4-rslora-layer1": dict(
        seed=2, r=4, lora_alpha=8, use_rslora=True, layers_to_transform=[1],
        target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    "mlp-patterns": dict(
        seed=3, r=8, lora_alpha=8, rank_pattern={"gate_proj": 2},
        alpha_pattern={"k_proj": 32},
        target_modules=["k_proj", "v_proj", "gate_proj", "up_proj",
                        "down_proj"]),
}


def make_adapters(base_path: str, root: str) -> dict[str, str]:
    """{name: folder} of ``ADAPTERS`` for ``base_path``."""
    out = {}
    for name, spec in ADAPTERS.items():
        spec = dict(spec)
        out[name] = make_peft_adapter(base_path, os.path.join(root, name),
                                      spec.pop("seed"), **spec)
    return out
