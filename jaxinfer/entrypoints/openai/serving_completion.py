"""`/v1/completions`: one engine request per prompt, n samples each; choice
index = prompt index * n + sample index (as OpenAI and vLLM number them).
``use_beam_search`` runs a beam search per prompt instead (`beam_search`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ...errors import http_status
from .errors import APIError, sse_error
from .protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    random_id,
)
from .serving_engine import (
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


class OpenAIServingCompletion(OpenAIServing):

    def _prompts(self, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        p = req.prompt
        if isinstance(p, str):
            p = [p]
        if not p:
            raise APIError("prompt must not be empty", param="prompt")
        if isinstance(p[0], int):
            p = [p]
        out = []
        for item in p:
            if isinstance(item, str):
                text, ids = item, self.engine.input_processor.encode(
                    "prompt", item, req.add_special_tokens)
            else:
                text, ids = None, self.check_ids("prompt", item)
            if req.truncate_prompt_tokens and len(ids) > req.truncate_prompt_tokens:
                text, ids = None, ids[-req.truncate_prompt_tokens:]
            out.append((text, ids))
        return out

    def _logprobs(self, token_ids, lps, k: int, offset: int,
                  as_id: bool = False) -> CompletionLogProbs:
        """OpenAI's completion logprobs; as vLLM, each position's
        top_logprobs holds the sampled token first, then the best others,
        k + 1 at most (so logprobs=0 still names the sampled token). A
        position without logprobs (the first prompt token) is null."""
        out = CompletionLogProbs()
        for tid, entries in zip(token_ids, lps):
            entries = entries or {}
            sampled = entries.get(tid)
            tok = self.token_text(tid, sampled, as_id)
            out.tokens.append(tok)
            out.token_logprobs.append(
                None if sampled is None else logprob_value(sampled))
            if not entries:
                out.top_logprobs.append(None)
            else:
                top = {tok: logprob_value(sampled)} if sampled is not None else {}
                for t, e in ranked(entries, k + 1):
                    if len(top) > k:
                        break
                    top.setdefault(self.token_text(t, e, as_id), logprob_value(e))
                out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(tok)
        return out

    def _params(self, req: CompletionRequest, ids: list[int]):
        sp = self.sampling_params(req, req.max_tokens, req.logprobs, len(ids))
        if req.echo and sp.logprobs is not None:  # req.logprobs, -1 resolved
            # Echoed prompt tokens carry logprobs too: ask the engine for them.
            sp.prompt_logprobs = max(sp.prompt_logprobs or 0, sp.logprobs)
        return sp

    async def create_completion(self, req: CompletionRequest,
                                raw_request: Request) -> Response:
        await self.models.refresh(req.model or "")
        model, lora = self.resolve_model(req.model)
        if req.stream and req.echo and req.logprobs is not None:
            raise APIError("echo with logprobs does not stream: set stream to "
                           "false", param="echo")
        prompts = await self.engine.run_blocking(self._prompts, req)
        params = [self._params(req, ids) for _, ids in prompts]
        request_id = (f"cmpl-{req.request_id}" if req.request_id
                      else random_id("cmpl"))
        engine_id = random_id("cmpl")  # a client's id may repeat
        as_id = self.tokens_as_ids(req)
        if req.use_beam_search:
            gens = None
            choices = await beam_choices(self.engine, engine_id, prompts,
                                         params, req.n, req.length_penalty,
                                         req.temperature or 0.0, raw_request,
                                         lora_request=lora)
            if choices is None:
                return Response(status_code=499)
        else:
            gens = await add_all(self.engine, engine_id, prompts, params,
                                 priority=req.priority, lora_request=lora)
            choices = {(i, j): Choice() for i in range(len(prompts))
                       for j in range(req.n)}
        prompt_texts = await self.engine.run_blocking(
            lambda: [text if text is not None else self.tokenizer.decode(ids)
                     for text, ids in prompts]) if req.echo else None
        num_prompt_tokens = sum(len(ids) for _, ids in prompts)
        usage = usage_counter(choices, num_prompt_tokens)

        if req.stream:
            options = req.stream_options
            return StreamingResponse(
                self._stream(gens, request_id, model, req, choices, prompts,
                             prompt_texts, usage, options, as_id),
                media_type="text/event-stream")

        prompt_lps: dict[int, list] = {}
        if gens is not None and not await collect_choices(
                gens, raw_request, choices, lambda i, j: (i, j), prompt_lps):
            return Response(status_code=499)  # client gone; requests aborted
        result = []
        for (i, j), ch in sorted(choices.items()):
            ids = prompts[i][1]
            prefix = prompt_texts[i] if prompt_texts else ""
            lp = None
            if req.logprobs is not None:
                k = params[i].logprobs
                lp = self._logprobs(ch.token_ids, ch.logprobs, k, len(prefix), as_id)
                if req.echo:
                    echoed = self._logprobs(ids, prompt_lps.get(i) or [None] * len(ids),
                                            k, 0, as_id)
                    lp = _joined(echoed, lp)
            result.append(CompletionResponseChoice(
                index=i * req.n + j, text=prefix + ch.text, logprobs=lp,
                finish_reason=ch.finish_reason, stop_reason=ch.stop_reason,
                prompt_logprobs=(self.prompt_logprobs_json(
                    ids, prompt_lps.get(i), as_id)
                    if req.prompt_logprobs is not None else None),
                prompt_token_ids=ids if req.return_token_ids else None,
                token_ids=ch.token_ids if req.return_token_ids else None))
        return Response(CompletionResponse(
            id=request_id, model=model, choices=result,
            usage=usage()).model_dump_json(), media_type="application/json")

    async def _stream(self, gens, request_id, model, req, choices, prompts,
                      prompt_texts, usage, options, as_id) -> AsyncIterator[str]:
        offsets = {key: 0 for key in choices}
        echoed: set = set()
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options.continuous_usage_stats)
        try:
            async for i, out in merge_streams(gens):
                for c in out.outputs:
                    key = (i, c.index)
                    toks, lps = choices[key].add(c)
                    text = c.text
                    first = key not in echoed
                    if prompt_texts and first:
                        text = prompt_texts[i] + text
                    echoed.add(key)
                    if not text and not toks and c.finish_reason is None:
                        continue
                    lp = None
                    if req.logprobs is not None:
                        lp = self._logprobs(toks, lps, req.logprobs, offsets[key],
                                            as_id)
                    offsets[key] += len(text)
                    chunk = CompletionResponse(
                        id=request_id, model=model, choices=[CompletionResponseChoice(
                            index=i * req.n + c.index, text=text, logprobs=lp,
                            finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason,
                            prompt_token_ids=(prompts[i][1] if req.return_token_ids
                                              and first else None),
                            token_ids=toks if req.return_token_ids else None)],
                        usage=usage() if continuous else None)
                    yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
            if include_usage:
                chunk = CompletionResponse(id=request_id, model=model,
                                           choices=[], usage=usage())
                yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
        except Exception as e:  # noqa: BLE001 - the client must hear why
            yield sse_error(str(e), http_status(e))
        yield "data: [DONE]\n\n"


def _joined(a: CompletionLogProbs, b: CompletionLogProbs) -> CompletionLogProbs:
    """The echoed prompt's logprobs followed by the completion's (whose
    offsets already start after the prompt text)."""
    return CompletionLogProbs(
        text_offset=a.text_offset + b.text_offset,
        token_logprobs=a.token_logprobs + b.token_logprobs,
        tokens=a.tokens + b.tokens, top_logprobs=a.top_logprobs + b.top_logprobs)
