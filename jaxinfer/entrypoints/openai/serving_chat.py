"""`/v1/chat/completions`: messages -> the chat template -> one engine
request with n samples; streaming sends the role first, then content deltas.
Image parts (``image_url``) become the prompt's images
(``jaxinfer/multimodal/chat.py``); tools and tool calls follow the request's
``ToolPlan`` (``serving_tools.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ...errors import http_status
from ...multimodal.chat import detect_content_format, parse_chat_messages
from .errors import APIError, sse_error
from .protocol import (
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamResponse,
    ChatLogprob,
    ChatMessage,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    TopLogprob,
    random_id,
)
from .serving_engine import (
    MIN_LOGPROB,
    Choice,
    OpenAIServing,
    add_all,
    beam_choices,
    collect_choices,
    logprob_value,
    merge_streams,
    ranked,
    usage_counter,
)
from .serving_tools import ToolConfig, ToolPlan, apply_plan, plan_tools, template_messages
from .tool_parsers import ToolCallStream, extract
from .tool_protocol import DeltaFunctionCall, DeltaToolCall, FunctionCallOut, ToolCall


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
                 models=None, content_format: str = "auto",
                 tool_config: ToolConfig | None = None):
        super().__init__(engine, served_model_names, models)
        self.chat_template = chat_template
        self.tool_config = tool_config or ToolConfig()
        # vLLM's --chat-template-content-format; auto: read from the template.
        self.content_format = (detect_content_format(
            chat_template or getattr(self.tokenizer, "chat_template", None))
            if content_format == "auto" else content_format)
        self.allowed_local_media_path = engine.model.args.allowed_local_media_path

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool,
               continue_final_message: bool,
               kwargs: dict[str, Any] | None,
               add_special_tokens: bool = False,
               tools: list[dict[str, Any]] | None = None
               ) -> tuple[str, list[int], list]:
        """The prompt text and ids, tokenized as `LLM.chat` tokenizes, and
        the messages' images (decoded) in placeholder order; ``tools``
        (OpenAI tool objects) are given to the template, as HF's
        ``apply_chat_template(tools=...)`` does."""
        if add_generation_prompt and continue_final_message:
            raise APIError("add_generation_prompt and continue_final_message "
                           "cannot both be true", param="continue_final_message")
        inputs = self.engine.input_processor
        conv, images = parse_chat_messages(
            template_messages(messages),
            content_format=self.content_format,
            placeholder=inputs.images.placeholder if inputs.images else "",
            allowed_local_media_path=self.allowed_local_media_path,
            on_first_image=lambda: inputs.check_takes_images(
                "an image_url content part"),
            check_count=inputs.images.check_count if inputs.images else None)
        try:
            text = self.tokenizer.apply_chat_template(
                conv, chat_template=self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tools=tools,
                **(kwargs or {}))
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
        await self.models.refresh(req.model or "")
        model, lora = self.resolve_model(req.model)
        if req.chat_template is not None:
            raise APIError("a per-request chat_template is not accepted; start "
                           "the server with --chat-template", param="chat_template")
        plan = plan_tools(req, self.tool_config)
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs to be true",
                           param="top_logprobs")
        top_k = (self.num_logprobs("top_logprobs", req.top_logprobs or 0)
                 if req.logprobs else None)
        text, ids, images = await self.engine.run_blocking(
            self.render, req.messages, req.add_generation_prompt,
            req.continue_final_message, req.chat_template_kwargs,
            req.add_special_tokens, plan.template_tools)
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
        params = apply_plan(plan, self.sampling_params(req, max_tokens, top_k,
                                                       len(ids)))
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
            # The request model refuses stream with use_beam_search.
            assert gens is not None
            return StreamingResponse(
                self._stream(gens[0], request_id, model, req, choices, top_k,
                             usage, req.stream_options, ids, echo, as_id, plan),
                media_type="text/event-stream")

        prompt_lps: dict[int, list] = {}
        if gens is not None and not await collect_choices(
                gens, raw_request, choices, lambda i, j: j, prompt_lps):
            return Response(status_code=499)  # client gone; request aborted
        messages = {j: _message(plan, echo, ch.text) for j, ch in choices.items()}
        result = [ChatCompletionResponseChoice(
            index=j, message=messages[j],
            logprobs=(self._logprobs(ch.token_ids, ch.logprobs, top_k, as_id)
                      if top_k is not None else None),
            finish_reason=_finish_reason(ch.finish_reason,
                                         bool(messages[j].tool_calls)),
            stop_reason=ch.stop_reason,
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
                      usage, options, prompt_ids, echo, as_id,
                      plan: ToolPlan) -> AsyncIterator[str]:
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
            calls = {j: ToolCallStream(plan.parser, plan.max_calls)
                     for j in range(req.n)} if plan.parser else {}
            async for _, out in merge_streams([gen]):
                for c in out.outputs:
                    ch = choices[c.index]
                    toks, lps = ch.add(c)
                    content, tool_calls = c.text, None
                    if calls:  # the parser decides what is content
                        stream = calls[c.index]
                        content, deltas = stream.update(
                            ch.text, final=c.finish_reason is not None)
                        tool_calls = [DeltaToolCall(
                            index=d.index, id=d.id,
                            type="function" if d.id else None,
                            function=DeltaFunctionCall(name=d.name,
                                                       arguments=d.arguments))
                            for d in deltas] or None
                    if (not content and not tool_calls and not toks
                            and c.finish_reason is None):
                        continue
                    finish = (_finish_reason(c.finish_reason,
                                             calls[c.index].called)
                              if calls else c.finish_reason)
                    yield chunk(ChatStreamChoice(
                        index=c.index, delta=DeltaMessage(
                            content=content, tool_calls=tool_calls),
                        logprobs=(self._logprobs(toks, lps, top_k, as_id)
                                  if top_k is not None else None),
                        finish_reason=finish, stop_reason=c.stop_reason,
                        token_ids=toks if req.return_token_ids else None))
            if include_usage:
                yield chunk(None, usage())
        except Exception as e:  # noqa: BLE001 - the client must hear why
            yield sse_error(str(e), http_status(e))
        yield "data: [DONE]\n\n"



def _message(plan: ToolPlan, echo: str, text: str) -> ChatResponseMessage:
    """A finished choice's message: its calls, when the plan reads any and
    the text holds them (at most ``plan.max_calls``), else the text."""
    if plan.parser is None:
        return ChatResponseMessage(content=echo + text)
    content, calls = extract(plan.parser, text)
    if plan.max_calls is not None:
        calls = calls[:plan.max_calls]
    if not calls:
        return ChatResponseMessage(content=echo + text)
    return ChatResponseMessage(
        content=(echo + (content or "")) or None,
        tool_calls=[ToolCall(id=c.id, function=FunctionCallOut(
            name=c.name, arguments=c.arguments)) for c in calls])


def _finish_reason(reason: str | None, called: bool) -> str | None:
    """"tool_calls" for an output that ended (not cut short) with calls."""
    return "tool_calls" if called and reason == "stop" else reason
