"""`LoRAConfig`: the engine's LoRA limits (vLLM's names and defaults)."""

from __future__ import annotations

import dataclasses

from ..errors import InvalidConfigError

MAX_RANK = 512  # vLLM's largest max_lora_rank


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 1  # adapters in one step (device slots)
    max_lora_rank: int = 16  # the largest adapter rank served (pool width)
    max_cpu_loras: int | None = None  # adapters kept in host memory; None: max_loras

    def __post_init__(self):
        for field in ("max_loras", "max_lora_rank"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfigError(
                    f"{field} must be a positive integer, got {value!r}")
        if self.max_lora_rank > MAX_RANK:
            raise InvalidConfigError(
                f"max_lora_rank must be <= {MAX_RANK}, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and (
                not isinstance(self.max_cpu_loras, int)
                or self.max_cpu_loras < self.max_loras):
            raise InvalidConfigError(
                f"max_cpu_loras must be an integer >= max_loras "
                f"({self.max_loras}), got {self.max_cpu_loras!r}")

    @property
    def cpu_capacity(self) -> int:
        """Adapters the host cache keeps beyond those requests in flight use."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
