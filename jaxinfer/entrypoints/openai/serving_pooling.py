"""`/v1/embeddings` (OpenAI's), `/pooling` and `/score` (vLLM's): one
engine pooling request per input, answered together with their usage.
An engine started for generation refuses each request (400), as a pooling
engine refuses completions."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np

from ...outputs import PoolingRequestOutput
from ...pooling.params import PoolingParams
from ..llm_pooling import cosine, score_pairs
from .errors import APIError
from .pooling_protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingFields,
    PoolingRequest,
    PoolingResponse,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from .protocol import UsageInfo, random_id
from .serving_engine import OpenAIServing


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as JSON floats, or as OpenAI's base64 (little-endian
    float32 bytes)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode()
    return [float(x) for x in vector]


def input_list(value: Any) -> list:
    """OpenAI's input forms as a list of prompts (strings or id lists)."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError("input must not be empty", param="input")
    if isinstance(value[0], int):
        return [value]
    return list(value)


class OpenAIServingPooling(OpenAIServing):

    def _params(self, req: PoolingFields, task: str,
                dimensions: int | None = None) -> PoolingParams:
        truncate = req.truncate_prompt_tokens
        try:
            return PoolingParams(
                # vLLM's -1: the whole context (no cut beyond max_model_len).
                truncate_prompt_tokens=None if truncate == -1 else truncate,
                dimensions=dimensions, normalize=req.normalize, task=task)
        except ValueError as e:
            raise APIError(str(e)) from None

    async def _pool(self, req: PoolingFields, prompts: list, task: str,
                    prefix: str, dimensions: int | None = None
                    ) -> tuple[str, list[PoolingRequestOutput]]:
        """(the model name to report, each prompt's pooled output)."""
        model, lora = self.resolve_model(req.model)
        if lora is not None:
            raise APIError(f"the model `{model}` is a LoRA adapter: pooling "
                           "runs on the base model only", param="model")
        params = self._params(req, task, dimensions)
        engine = self.engine
        processed = [await engine.run_blocking(
            engine.input_processor.process_pooling,
            p if isinstance(p, str) else {"prompt_token_ids": p}, params,
            req.add_special_tokens) for p in prompts]
        request_id = random_id(prefix)
        streams = []
        try:
            for i, p in enumerate(processed):
                streams.append(await engine.add_request(
                    f"{request_id}-{i}", p, priority=req.priority))
        except BaseException:
            for s in streams:
                engine.abort(s.request_id)
            raise

        async def final(stream) -> PoolingRequestOutput:
            last = None
            async for out in engine.iterate(stream):
                last = out
            if not isinstance(last, PoolingRequestOutput):
                raise APIError("the engine returned no pooled output", 500)
            return last

        return model, list(await asyncio.gather(*(final(s) for s in streams)))

    @staticmethod
    def _usage(outs: list[PoolingRequestOutput]) -> UsageInfo:
        n = sum(len(o.prompt_token_ids) for o in outs)
        return UsageInfo(prompt_tokens=n, total_tokens=n)

    async def create_embedding(self, req: EmbeddingRequest) -> EmbeddingResponse:
        model, outs = await self._pool(req, input_list(req.input), "embed",
                                       "embd", req.dimensions)
        return EmbeddingResponse(model=model, usage=self._usage(outs), data=[
            EmbeddingData(index=i, embedding=encode_vector(
                o.outputs.data, req.encoding_format))
            for i, o in enumerate(outs)])

    async def create_pooling(self, req: PoolingRequest) -> PoolingResponse:
        model, outs = await self._pool(req, input_list(req.input), "encode",
                                       "pool", req.dimensions)
        return PoolingResponse(model=model, usage=self._usage(outs), data=[
            PoolingData(index=i, data=encode_vector(o.outputs.data,
                                                    req.encoding_format))
            for i, o in enumerate(outs)])

    async def create_score(self, req: ScoreRequest) -> ScoreResponse:
        try:
            first, second = score_pairs(req.text_1, req.text_2)
        except ValueError as e:
            raise APIError(str(e), param="text_2") from None
        model, outs = await self._pool(req, first + second, "score", "score")
        n = len(first)
        return ScoreResponse(model=model, usage=self._usage(outs), data=[
            ScoreData(index=i, score=cosine(a.outputs.data, b.outputs.data))
            for i, (a, b) in enumerate(zip(outs[:n], outs[n:]))])
