"""Meshes and partition rules (``jaxinfer.sharding``). Tensor parallelism is
not built yet; see docs/architecture.md."""
