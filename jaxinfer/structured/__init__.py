"""Structured outputs: requests whose output must follow a JSON schema, a
regex, a list of choices or a grammar. `params.py` holds vLLM's request
types, `grammar.py` compiles them with llguidance (cached per spec and
tokenizer) and gives each request a matcher that advances on the host;
`bitmask.py` packs the matchers' token masks, which the sampler applies
inside the jitted step (worker/sampler.py)."""

from .params import GuidedDecodingParams, StructuredOutputsParams

__all__ = ["StructuredOutputsParams", "GuidedDecodingParams"]
