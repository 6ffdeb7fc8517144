"""User-facing entry points: the `LLM` class and the `jaxinfer` CLI."""
