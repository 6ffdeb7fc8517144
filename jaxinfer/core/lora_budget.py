"""`AdapterBudget`: at most ``max_loras`` distinct LoRA adapters among the
running requests (vLLM's rule), so that every step's adapters fit in the
device slots. A waiting request whose adapter would be one too many is
passed over (it keeps its place in the queue) until a running request's
adapter frees up; requests behind it still start. No JAX here."""

from __future__ import annotations

from ..request import Request


def adapter_id(req: Request) -> int | None:
    return req.lora_request.lora_int_id if req.lora_request is not None else None


class AdapterBudget:
    def __init__(self, max_loras: int | None):
        self.max_loras = max_loras  # None: LoRA off, nothing to count
        self._active: set[int] = set()

    def start(self, running: list[Request]) -> None:
        """The adapters in use before this step's admissions."""
        self._active = {a for a in map(adapter_id, running) if a is not None}

    def admits(self, req: Request) -> bool:
        a = adapter_id(req)
        return (a is None or self.max_loras is None or a in self._active
                or len(self._active) < self.max_loras)

    def admit(self, req: Request) -> None:
        a = adapter_id(req)
        if a is not None:
            self._active.add(a)
