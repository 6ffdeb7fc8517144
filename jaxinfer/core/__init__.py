"""The pure-Python core: page accounting and scheduling. Never imports JAX."""
