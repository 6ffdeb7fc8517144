"""Typed errors of LoRA adapters. Each is an `InvalidRequestError` (a
ValueError): the request that names the adapter fails with a message saying
what to change (the server answers 400, or 404 for a missing adapter), and
the engine goes on serving the others."""

from __future__ import annotations

from ..errors import InvalidRequestError


class LoRAError(InvalidRequestError):
    """A LoRA adapter or request that cannot be served."""


class LoRANotEnabledError(LoRAError):
    """A request names an adapter but the engine runs without LoRA."""


class LoRAAdapterNotFoundError(LoRAError):
    """The adapter's folder or one of its files does not exist."""
    status = 404  # what the server's load endpoint answers (as vLLM)


class UnsupportedLoRAAdapterError(LoRAError):
    """An adapter using a PEFT feature jaxinfer does not run (DoRA,
    adapters on embeddings or lm_head, bias terms, ...)."""


class LoRARankError(LoRAError):
    """An adapter's rank exceeds ``max_lora_rank``."""


class UnknownLoRAModuleError(LoRAError):
    """An adapter targets a module the model does not have."""


class LoRAShapeMismatchError(LoRAError):
    """An adapter tensor's shape does not fit the model's layer."""
