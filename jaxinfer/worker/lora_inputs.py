"""Runner side of LoRA: the device pool, the slot each adapter holds, and
each step's per-token slot ids.

A step whose rows all run the base model gets None (no slot ids, no pool
argument): its compiled program has no LoRA work at all. Otherwise every
adapter its rows need is put into a slot first (queued on the device
before the step, so a load delays only the step that needs it), and each
token gets its row's slot (0 for rows without an adapter).
"""

from __future__ import annotations

import numpy as np

from jaxinfer.models import model_spec
from jaxinfer.models.lora import lora_targets

from ..core.scheduler_output import NewRequestData, ScheduledRequest
from ..lora.config import LoRAConfig
from ..lora.layout import SlotLayout
from ..lora.pool import LoRAPool
from ..lora.slots import SlotTable
from ..lora.store import AdapterStore


class LoRAInputs:
    def __init__(self, model, cfg, config: LoRAConfig, dtype, mesh):
        self.config = config
        targets = lora_targets(model, cfg, model_spec(cfg.architecture))
        self.layout = SlotLayout(targets, config.max_lora_rank)
        self.pool = LoRAPool(self.layout, config.max_loras, dtype, mesh)
        self.store = AdapterStore(self.layout, dtype, config.cpu_capacity,
                                  stage=self.pool.stage)
        self.slots = SlotTable(config.max_loras)
        self.num_slot_loads = 0  # adapters copied into device slots

    def token_slots(self, sched: list[ScheduledRequest],
                    requests: dict[str, NewRequestData],
                    num_tokens: int) -> np.ndarray | None:
        """[num_tokens] slot id of every token of the step (padding: 0), or
        None when no row uses an adapter."""
        loras = [requests[s.request_id].lora_request for s in sched]
        if not any(loras):
            return None
        adapters = [self._adapter(r) if r is not None else None for r in loras]
        by_key = {a.key: a for a in adapters if a is not None}
        slot_of, loads = self.slots.assign(by_key)
        for slot, key in loads:
            self.pool.write(slot, by_key[key])
            self.num_slot_loads += 1
        row_slots = np.fromiter((0 if a is None else slot_of[a.key]
                                 for a in adapters), np.int32, len(sched))
        q_lens = np.fromiter((len(s.token_ids) for s in sched), np.int32,
                             len(sched))
        out = np.zeros(num_tokens, np.int32)
        out[:int(q_lens.sum())] = np.repeat(row_slots, q_lens)
        return out

    def _adapter(self, request):
        """Requests in flight hold their adapter in the store; a miss means
        this process has not seen the request's adapter (read it now)."""
        adapter = self.store.get(request.lora_int_id)
        if adapter is None or adapter.request.lora_path != request.lora_path:
            adapter = self.store.load(request)
        return adapter
