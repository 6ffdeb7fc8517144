"""LoRA adapters (vLLM's ``enable_lora``): requests, PEFT adapters read from
disk, the host cache of loaded adapters and the device pool the jitted step
reads. ``docs/architecture.md`` ("LoRA adapters") is the map."""
