"""The OpenAI-compatible server (`jaxinfer serve`)."""
