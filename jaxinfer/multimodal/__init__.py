"""Images in front of a language model: loading media (data URLs, local
files behind an allowed path), preprocessing with the checkpoint's own
image processor, placeholders in prompts and chat messages, and the
per-prompt limits (``limit_mm_per_prompt``). Nothing here imports JAX: the
encoder runs in ``jaxinfer/worker/encoder_runner.py``."""
