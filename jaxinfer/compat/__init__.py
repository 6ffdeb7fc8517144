"""Compatibility with vLLM's public surface: which of its flags, engine
arguments, sampling fields and request fields jaxinfer supports, ignores
(harmlessly, with the reason) or refuses (naming the missing feature).
``docs/compatibility.md`` is generated from here (``python -m
jaxinfer.compat.render``)."""
