"""`LoRARequest`: which adapter a request runs with (vLLM's class, same
fields and meaning)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ..errors import InvalidRequestError, UnsupportedFeatureError


@dataclasses.dataclass(eq=False)
class LoRARequest:
    """A LoRA adapter for a request.

    ``lora_name``: a name for people (the server's model name);
    ``lora_int_id``: a positive id, unique per adapter (the engine caches
    adapters by it); ``lora_path``: a local PEFT adapter folder
    (``adapter_config.json`` + ``adapter_model.safetensors``).

    As in vLLM, two requests are equal when their names are."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_local_path: str | None = None  # deprecated spelling of lora_path
    long_lora_max_len: int | None = None
    base_model_name: str | None = None  # the served model it belongs to
    tensorizer_config_dict: dict | None = None

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidRequestError(
                f"LoRARequest.lora_name must be a non-empty string, got "
                f"{self.lora_name!r}")
        if (not isinstance(self.lora_int_id, int)
                or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1):
            raise InvalidRequestError(
                f"LoRARequest.lora_int_id must be an integer >= 1 (0 is the "
                f"base model), got {self.lora_int_id!r}")
        if self.lora_local_path:
            warnings.warn("LoRARequest.lora_local_path is deprecated: use "
                          "lora_path", DeprecationWarning, stacklevel=3)
            if not self.lora_path:
                self.lora_path = self.lora_local_path
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidRequestError(
                "LoRARequest.lora_path must name the adapter's local folder")
        if self.long_lora_max_len is not None:
            raise UnsupportedFeatureError(
                "LoRARequest.long_lora_max_len", "long-context (LongLoRA) "
                "adapters", "leave long_lora_max_len unset")
        if self.tensorizer_config_dict is not None:
            raise UnsupportedFeatureError(
                "LoRARequest.tensorizer_config_dict", "tensorized adapters",
                "save the adapter in PEFT's safetensors format")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, LoRARequest)
                and self.lora_name == other.lora_name)

    def __hash__(self) -> int:
        return hash(self.lora_name)


def per_prompt(lora_request, n: int) -> list:
    """``lora_request`` of ``LLM.generate`` / ``chat`` / ``beam_search``
    spread over n prompts: one LoRARequest (or None) for all, or a list of
    n (None: that prompt runs the base model), as vLLM takes it."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    if isinstance(lora_request, (list, tuple)):
        if len(lora_request) != n:
            raise InvalidRequestError(
                f"got {len(lora_request)} lora_requests for {n} prompts: "
                "give one per prompt, or one for all")
        return list(lora_request)
    raise InvalidRequestError(
        f"lora_request must be a LoRARequest or a list of them, got "
        f"{type(lora_request).__name__}")
