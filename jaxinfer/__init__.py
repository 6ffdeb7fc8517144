"""jaxinfer: a vLLM-class LLM inference engine in JAX.

    from jaxinfer import LLM, SamplingParams
    llm = LLM()  # the embedded SmolLM2-135M-Instruct, offline
    out = llm.generate(["Hello"], SamplingParams(max_tokens=16, temperature=0))
"""

from __future__ import annotations

__version__ = "0.1.0"

# Lazy exports: `import jaxinfer.models` must not pull the engine in (and the
# engine imports models, so eager imports here would be circular).
_EXPORTS = {
    "LLM": ("jaxinfer.entrypoints.llm", "LLM"),
    "LLMEngine": ("jaxinfer.engine.llm_engine", "LLMEngine"),
    "EngineArgs": ("jaxinfer.config", "EngineArgs"),
    "SamplingParams": ("jaxinfer.sampling_params", "SamplingParams"),
    "RequestOutputKind": ("jaxinfer.sampling_params", "RequestOutputKind"),
    "BeamSearchParams": ("jaxinfer.sampling_params", "BeamSearchParams"),
    "StructuredOutputsParams": ("jaxinfer.structured.params",
                                "StructuredOutputsParams"),
    "GuidedDecodingParams": ("jaxinfer.structured.params",
                             "GuidedDecodingParams"),
    "RequestOutput": ("jaxinfer.outputs", "RequestOutput"),
    "CompletionOutput": ("jaxinfer.outputs", "CompletionOutput"),
    "PoolingParams": ("jaxinfer.pooling.params", "PoolingParams"),
    "PoolingRequestOutput": ("jaxinfer.outputs", "PoolingRequestOutput"),
    "EmbeddingRequestOutput": ("jaxinfer.outputs", "EmbeddingRequestOutput"),
    "ScoringRequestOutput": ("jaxinfer.outputs", "ScoringRequestOutput"),
    "InvalidRequestError": ("jaxinfer.errors", "InvalidRequestError"),
    "LoRARequest": ("jaxinfer.lora.request", "LoRARequest"),
}

__all__ = list(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxinfer' has no attribute {name!r}")
