"""`/v1/chat/completions`: messages -> the chat template -> one engine
request with n samples; streaming sends the role first, then content deltas.
Image parts (``image_url``) become the prompt's images
(``jaxinfer/multimodal/chat.py``)."""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ...errors import http_status
from ...multimodal.chat import detect_content_format, parse_chat_messages
from .errors import APIError, sse_error
from .protocol import (ChatChoiceLogprobs, ChatCompletionRequest,
                       ChatCompletionResponse, ChatCompletionResponseChoice,
                       ChatCompletionStreamResponse, ChatLogprob, ChatMessage,
                       ChatResponseMessage, ChatStreamChoice, DeltaMessage,
                       TopLogprob, random_id)
from .serving_engine import (MIN_LOGPROB, Choice, OpenAIServing, add_all,
                             beam_choices, collect_choices, logprob_value,
                             merge_streams, ranked, usage_counter)


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file path or the template text itself (as vLLM)."""
    if value is None:
        return None
    import os
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a "
                         "Jinja template")
    return value


def _message_dict(m: ChatMessage) -> dict[str, Any]:
    """A message's text (its text parts joined; images left out)."""
    d = m.model_dump(exclude_none=True)
    if isinstance(m.content, list):  # text parts -> one string
        d["content"] = "\n".join(part.text for part in m.content
                                 if part.type == "text")
    elif m.content is None:  # e.g. an assistant turn that only called tools
        d["content"] = ""
    return d


def _echoed(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text, when that message has the
    role being generated (the assistant's, or with add_generation_prompt
    false the last message's own)."""
    if not req.echo:
        return ""
    last = req.messages[-1]
    role = "assistant" if req.add_generation_prompt else last.role
    if last.role != role:
        return ""
    return _message_dict(last)["content"]


class OpenAIServingChat(OpenAIServing):
    def __init__(self, engine, served_model_names, chat_template: str | None = None,
                 models=None, content_format: str = "auto"):
        super().__init__(engine, served_model_names, models)
        self.chat_template = chat_template
        # vLLM's --chat-template-content-format; auto: read from the template.
        self.content_format = (detect_content_format(
            chat_template or getattr(self.tokenizer, "chat_template", None))
            if content_format == "auto" else content_format)
        self.allowed_local_media_path = engine.engine.args.allowed_local_media_path

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool,
               continue_final_message: bool,
               kwargs: dict[str, Any] | None,
               add_special_tokens: bool = False
               ) -> tuple[str, list[int], list]:
        """The prompt text and ids, tokenized as `LLM.chat` tokenizes, and
        the messages' images (decoded) in placeholder order."""
        if add_generation_prompt and continue_final_message:
            raise APIError("add_generation_prompt and continue_final_message "
                           "cannot both be true", param="continue_final_message")
        inputs = self.engine.input_processor
        conv, images = parse_chat_messages(
            [m.model_dump(exclude_none=True) for m in messages],
            content_format=self.content_format,
            placeholder=inputs.images.placeholder if inputs.images else "",
            allowed_local_media_path=self.allowed_local_media_path,
            on_first_image=lambda: inputs.check_takes_images(
                "an image_url content part"))
        try:
            text = self.tokenizer.apply_chat_template(
                conv, chat_template=self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(kwargs or {}))
        except Exception as e:  # noqa: BLE001 - any template failure is bad input
            raise APIError(f"could not apply the chat template: {e}. Check the "
                           "messages, or start the server with --chat-template",
                           param="messages") from None
        if not isinstance(text, str):
            raise APIError("the chat template did not render to text",
                           param="chat_template_kwargs")
        return text, inputs.encode("the rendered chat", text,
                                   add_special_tokens=add_special_tokens), images

    def _logprobs(self, token_ids, lps, k: int,
                  as_id: bool = False) -> ChatChoiceLogprobs:
        content = []
        for tid, entries in zip(token_ids, lps):
            sampled = entries.get(tid)
            tok = self.token_text(tid, sampled, as_id)
            top = [TopLogprob(token=(t_text := self.token_text(t, e, as_id)),
                              logprob=logprob_value(e),
                              bytes=list(t_text.encode("utf-8")))
                   for t, e in ranked(entries, k)]
            content.append(ChatLogprob(
                token=tok, bytes=list(tok.encode("utf-8")), top_logprobs=top,
                logprob=MIN_LOGPROB if sampled is None else logprob_value(sampled)))
        return ChatChoiceLogprobs(content=content)

    async def create_chat_completion(self, req: ChatCompletionRequest,
                                     raw_request: Request) -> Response:
        model, lora = self.resolve_model(req.model)
        if req.chat_template is not None:
            raise APIError("a per-request chat_template is not accepted; start "
                           "the server with --chat-template", param="chat_template")
        if req.tools and req.tool_choice != "none":
            raise APIError("tool calling is not supported; omit tools or set "
                           "tool_choice to 'none'", param="tools")
        if req.response_format is not None and req.response_format.type != "text":
            raise APIError("structured output (response_format "
                           f"{req.response_format.type!r}) is not supported",
                           param="response_format")
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs to be true",
                           param="top_logprobs")
        top_k = (self.num_logprobs("top_logprobs", req.top_logprobs or 0)
                 if req.logprobs else None)
        text, ids, images = await self.engine.run_blocking(
            self.render, req.messages, req.add_generation_prompt,
            req.continue_final_message, req.chat_template_kwargs,
            req.add_special_tokens)
        if images and req.use_beam_search:
            raise APIError("use_beam_search does not take images: send the "
                           "request without it", param="use_beam_search")
        mm_data = None
        if images:  # the prompt as the engine counts it: placeholders expanded
            mm_data = {"image": images}
            ids = self.engine.input_processor.images.expand(ids, len(images))[0]
        if req.truncate_prompt_tokens and len(ids) > req.truncate_prompt_tokens:
            if images:
                raise APIError("truncate_prompt_tokens cannot be combined with "
                               "images (it could cut an image's placeholders)",
                               param="truncate_prompt_tokens")
            text, ids = None, ids[-req.truncate_prompt_tokens:]
        max_tokens = (req.max_completion_tokens if req.max_completion_tokens
                      is not None else req.max_tokens)
        params = self.sampling_params(req, max_tokens, top_k, len(ids))
        request_id = (f"chatcmpl-{req.request_id}" if req.request_id
                      else random_id("chatcmpl"))
        engine_id = random_id("chatcmpl")  # a client's id may repeat
        as_id = self.tokens_as_ids(req)
        echo = _echoed(req)
        if req.use_beam_search:
            gens = None
            beams = await beam_choices(self.engine, engine_id, [(text, ids)],
                                       [params], req.n, req.length_penalty,
                                       req.temperature or 0.0, raw_request,
                                       lora_request=lora)
            if beams is None:
                return Response(status_code=499)
            choices = {j: ch for (_, j), ch in beams.items()}
        else:
            gens = await add_all(self.engine, engine_id, [(text, ids)], [params],
                                 priority=req.priority,
                                 multi_modal_data=[mm_data], lora_request=lora)
            choices = {j: Choice() for j in range(req.n)}

        usage = usage_counter(choices, len(ids))

        if req.stream:
            return StreamingResponse(
                self._stream(gens[0], request_id, model, req, choices, top_k,
                             usage, req.stream_options, ids, echo, as_id),
                media_type="text/event-stream")

        prompt_lps: dict[int, list] = {}
        if gens is not None and not await collect_choices(
                gens, raw_request, choices, lambda i, j: j, prompt_lps):
            return Response(status_code=499)  # client gone; request aborted
        result = [ChatCompletionResponseChoice(
            index=j, message=ChatResponseMessage(content=echo + ch.text),
            logprobs=(self._logprobs(ch.token_ids, ch.logprobs, top_k, as_id)
                      if top_k is not None else None),
            finish_reason=ch.finish_reason, stop_reason=ch.stop_reason,
            token_ids=ch.token_ids if req.return_token_ids else None)
            for j, ch in sorted(choices.items())]
        return Response(ChatCompletionResponse(
            id=request_id, model=model, choices=result, usage=usage(),
            prompt_logprobs=(self.prompt_logprobs_json(ids, prompt_lps.get(0),
                                                       as_id)
                             if req.prompt_logprobs is not None else None),
            prompt_token_ids=ids if req.return_token_ids else None,
        ).model_dump_json(), media_type="application/json")

    async def _stream(self, gen, request_id, model, req, choices, top_k,
                      usage, options, prompt_ids, echo, as_id) -> AsyncIterator[str]:
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options.continuous_usage_stats)

        def chunk(choice: ChatStreamChoice | None, usage_info=None) -> str:
            body = ChatCompletionStreamResponse(
                id=request_id, model=model,
                choices=[choice] if choice is not None else [],
                usage=usage_info if usage_info is not None else
                (usage() if continuous else None))
            return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

        try:
            for j in range(req.n):
                yield chunk(ChatStreamChoice(
                    index=j, delta=DeltaMessage(role="assistant", content=echo)))
            async for _, out in merge_streams([gen]):
                for c in out.outputs:
                    toks, lps = choices[c.index].add(c)
                    if not c.text and not toks and c.finish_reason is None:
                        continue
                    yield chunk(ChatStreamChoice(
                        index=c.index, delta=DeltaMessage(content=c.text),
                        logprobs=(self._logprobs(toks, lps, top_k, as_id)
                                  if top_k is not None else None),
                        finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                        token_ids=toks if req.return_token_ids else None))
            if include_usage:
                yield chunk(None, usage())
        except Exception as e:  # noqa: BLE001 - the client must hear why
            yield sse_error(str(e), http_status(e))
        yield "data: [DONE]\n\n"

