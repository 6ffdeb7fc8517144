"""vLLM's ``SamplingParams`` fields and OpenAI-server request fields that
jaxinfer does not implement: each ignored with the reason that makes that
harmless, or refused naming the missing feature (the server answers 400).
A field of our own models with an entry here is refused or ignored in spite
of being parsed (e.g. ``tools``); one without is supported."""

from __future__ import annotations

from typing import Any

from .engine_flags import LORA, MM
from .status import Status, ignore, refuse

EMPTY: tuple[Any, ...] = (None, {}, [], "")

# SamplingParams(...) keyword arguments.
SAMPLING_FIELDS: dict[str, Status] = {
    "logits_processors": refuse("custom logits processors", accepts=EMPTY),
    "output_text_buffer_length": ignore(
        "it only holds back streamed text in vLLM; the text produced is "
        "the same"),
    "extra_args": refuse("extra_args (for custom logits processors)",
                         accepts=EMPTY),
}

# Fields of /v1/completions and /v1/chat/completions bodies.
REQUEST_FIELDS: dict[str, Status] = {
    "suffix": refuse("suffix (fill-in-the-middle completion)", accepts=EMPTY),
    "prompt_embeds": refuse("prompt embeddings as input", accepts=EMPTY),
    "structural_tag": refuse(
        "structural tags", "use response_format, structured_outputs or "
        "guided_json / guided_regex / guided_choice / guided_grammar"),
    "logits_processors": refuse("custom logits processors", accepts=EMPTY),
    "cache_salt": refuse("per-request prefix cache salts"),
    "kv_transfer_params": refuse("KV transfer (disaggregated prefill)"),
    "vllm_xargs": refuse("vllm_xargs (for custom logits processors)",
                         accepts=EMPTY),
    "reasoning_effort": refuse("reasoning models' effort setting"),
    "include_reasoning": ignore("no served model emits separate reasoning"),
    "documents": refuse("documents for RAG chat templates", accepts=EMPTY),
    "mm_processor_kwargs": refuse("per-request image processor overrides",
                                  accepts=EMPTY),
    "user": ignore("an end-user id for abuse monitoring; nothing here "
                   "monitors"),
    # Keys qualified by endpoint apply to that endpoint only.
    "chat.chat_template": refuse(
        "chat templates sent in requests",
        "start the server with --chat-template"),
    "tokenize_chat.chat_template": refuse(
        "chat templates sent in requests",
        "start the server with --chat-template"),
}

# The qualifier of each endpoint's keys above.
ENDPOINT_QUALIFIER = {"completion_request": "completion",
                      "chat_completion_request": "chat",
                      "tokenize_completion": "tokenize",
                      "tokenize_chat": "tokenize_chat",
                      "detokenize": "detokenize",
                      "stream_options": "stream_options"}


def request_field_status(kind: str, name: str) -> Status | None:
    """The entry for a field of one endpoint (qualified key first)."""
    qualifier = ENDPOINT_QUALIFIER[kind]
    return (REQUEST_FIELDS.get(f"{qualifier}.{name}")
            or (None if kind == "stream_options" else REQUEST_FIELDS.get(name)))

# Keys of a chat message content part jaxinfer cannot render (images are
# served by models that take them: jaxinfer/multimodal/chat.py).
CONTENT_PART_FEATURES = {"input_audio": MM, "video_url": MM, "audio_url": MM,
                         "image_embeds": "image embeddings as input"}

__all__ = ["SAMPLING_FIELDS", "REQUEST_FIELDS", "CONTENT_PART_FEATURES", "LORA"]
