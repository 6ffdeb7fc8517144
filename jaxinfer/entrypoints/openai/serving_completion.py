"""`/v1/completions`: one engine request per prompt, n samples each; choice
index = prompt index * n + sample index (as OpenAI and vLLM number them)."""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ...errors import http_status
from .errors import APIError, sse_error
from .protocol import (CompletionLogProbs, CompletionRequest,
                       CompletionResponse, CompletionResponseChoice,
                       random_id)
from .serving_engine import (Choice, OpenAIServing, add_all,
                             collect_choices, logprob_value, merge_streams,
                             ranked, usage_counter)


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
                out.append((item, self.engine.input_processor.encode(
                    "prompt", item, req.add_special_tokens)))
            else:
                out.append((None, self.check_ids("prompt", item)))
        return out

    def _logprobs(self, token_ids, lps, k: int, offset: int) -> CompletionLogProbs:
        out = CompletionLogProbs()
        for tid, entries in zip(token_ids, lps):
            sampled = entries.get(tid)
            tok = self.token_text(tid, sampled)
            out.tokens.append(tok)
            out.token_logprobs.append(
                None if sampled is None else logprob_value(sampled))
            out.top_logprobs.append(
                {self.token_text(t, e): logprob_value(e)
                 for t, e in ranked(entries, k)} if k > 0 else None)
            out.text_offset.append(offset)
            offset += len(tok)
        return out

    async def create_completion(self, req: CompletionRequest,
                                raw_request: Request) -> Response:
        model = self.check_model(req.model)
        if req.suffix:
            raise APIError("suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError("best_of must equal n (or be unset)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError("echo with logprobs needs prompt logprobs, which are "
                           "not supported yet", param="echo")
        prompts = await self.engine.run_blocking(self._prompts, req)
        params = [self.sampling_params(req, req.max_tokens, req.logprobs, len(ids))
                  for _, ids in prompts]
        request_id = random_id("cmpl")
        gens = await add_all(self.engine, request_id, prompts, params)
        prompt_texts = await self.engine.run_blocking(
            lambda: [text if text is not None else self.tokenizer.decode(ids)
                     for text, ids in prompts]) if req.echo else None
        choices = {(i, j): Choice() for i in range(len(prompts))
                   for j in range(req.n)}
        num_prompt_tokens = sum(len(ids) for _, ids in prompts)

        usage = usage_counter(choices, num_prompt_tokens)

        if req.stream:
            include_usage = bool(req.stream_options and
                                 req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(gens, request_id, model, req, choices, prompt_texts,
                             usage, include_usage),
                media_type="text/event-stream")

        if not await collect_choices(gens, raw_request, choices,
                                     lambda i, j: (i, j)):
            return Response(status_code=499)  # client gone; requests aborted
        result = []
        for (i, j), ch in sorted(choices.items()):
            prefix = prompt_texts[i] if prompt_texts else ""
            lp = (self._logprobs(ch.token_ids, ch.logprobs, req.logprobs, len(prefix))
                  if req.logprobs is not None else None)
            result.append(CompletionResponseChoice(
                index=i * req.n + j, text=prefix + ch.text, logprobs=lp,
                finish_reason=ch.finish_reason, stop_reason=ch.stop_reason))
        return Response(CompletionResponse(
            id=request_id, model=model, choices=result,
            usage=usage()).model_dump_json(), media_type="application/json")

    async def _stream(self, gens, request_id, model, req, choices, prompt_texts,
                      usage, include_usage) -> AsyncIterator[str]:
        offsets = {key: 0 for key in choices}
        echoed: set = set()
        try:
            async for i, out in merge_streams(gens):
                for c in out.outputs:
                    key = (i, c.index)
                    toks, lps = choices[key].add(c)
                    text = c.text
                    if prompt_texts and key not in echoed:
                        echoed.add(key)
                        text = prompt_texts[i] + text
                    if not text and not toks and c.finish_reason is None:
                        continue
                    lp = None
                    if req.logprobs is not None:
                        lp = self._logprobs(toks, lps, req.logprobs, offsets[key])
                    offsets[key] += len(text)
                    chunk = CompletionResponse(
                        id=request_id, model=model, choices=[CompletionResponseChoice(
                            index=i * req.n + c.index, text=text, logprobs=lp,
                            finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason)])
                    yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
            if include_usage:
                chunk = CompletionResponse(id=request_id, model=model,
                                           choices=[], usage=usage())
                yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
        except Exception as e:  # noqa: BLE001 - the client must hear why
            yield sse_error(str(e), http_status(e))
        yield "data: [DONE]\n\n"
