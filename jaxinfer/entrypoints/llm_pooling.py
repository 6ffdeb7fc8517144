"""`LLM.encode`, `LLM.embed` and `LLM.score` (vLLM's offline pooling API)
for an engine started with ``runner="pooling"``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidRequestError, UnsupportedFeatureError
from ..outputs import (
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from ..pooling.params import PoolingParams


def as_prompt_list(prompts: Any) -> list:
    """One prompt (a string, a dict, a list of token ids) or a list."""
    if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts
            and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


def pooling_params_for(params: Any, n: int, task: str,
                       truncate_prompt_tokens: int | None) -> list[PoolingParams]:
    """One PoolingParams per prompt (one for all, or a list), each a copy
    with ``task`` and, when given, ``truncate_prompt_tokens`` set."""
    if params is None or isinstance(params, PoolingParams):
        params = [params or PoolingParams()] * n
    params = list(params)
    if len(params) != n:
        raise InvalidRequestError(f"got {len(params)} PoolingParams for {n} prompts")
    out = []
    for p in params:
        if not isinstance(p, PoolingParams):
            raise InvalidRequestError(
                f"pooling_params must be PoolingParams, got {type(p).__name__}")
        p = p.clone()
        p.task = task
        if truncate_prompt_tokens is not None:
            p.truncate_prompt_tokens = truncate_prompt_tokens
            p.__post_init__()  # checks the new value
        out.append(p)
    return out


def run_pooling(llm, prompts: Any, params: Any, task: str, use_tqdm: bool,
                lora_request: Any, truncate_prompt_tokens: int | None
                ) -> list[PoolingRequestOutput]:
    """Pools every prompt; outputs in input order. Atomic as
    `LLM.generate`: every prompt is checked before any is queued."""
    if lora_request is not None:
        raise UnsupportedFeatureError(
            "lora_request", "LoRA adapters on a pooling model",
            "drop lora_request")
    engine = llm.llm_engine
    prompts = as_prompt_list(prompts)
    params = pooling_params_for(params, len(prompts), task,
                                truncate_prompt_tokens)
    processed = [engine.input_processor.process_pooling(p, pp)
                 for p, pp in zip(prompts, params)]
    ids: list[str] = []
    try:
        for request in processed:
            ids.append(engine.add_request(None, request))
    except BaseException:
        engine.abort_request(ids)
        raise
    final: dict[str, PoolingRequestOutput] = {}
    bar = None
    if use_tqdm:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True)
    wanted = set(ids)
    try:
        while engine.has_unfinished_requests() and len(final) < len(ids):
            for out in engine.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
    except BaseException:  # interrupted: leave nothing for the next call
        engine.abort_request([i for i in ids if i not in final])
        raise
    finally:
        if bar is not None:
            bar.close()
    return [final[i] for i in ids]


def embed(llm, prompts, pooling_params, use_tqdm, lora_request,
          truncate_prompt_tokens) -> list[EmbeddingRequestOutput]:
    return [EmbeddingRequestOutput.from_base(o) for o in run_pooling(
        llm, prompts, pooling_params, "embed", use_tqdm, lora_request,
        truncate_prompt_tokens)]


def score_pairs(data_1: Any, data_2: Any) -> tuple[list, list]:
    """vLLM's pairing: one text against each of a list, or two lists of the
    same length pairwise."""
    first, second = as_prompt_list(data_1), as_prompt_list(data_2)
    if not first or not second:
        raise InvalidRequestError("score needs at least one text on each side")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidRequestError(
            f"score pairs texts one to one: got {len(first)} and "
            f"{len(second)} (give one first text, or lists of one length)")
    return first, second


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denom = max(float(np.linalg.norm(a64) * np.linalg.norm(b64)), 1e-12)
    return float(a64 @ b64 / denom)


def score(llm, data_1, data_2, pooling_params, use_tqdm, lora_request,
          truncate_prompt_tokens) -> list[ScoringRequestOutput]:
    """Cosine similarity of each pair's embeddings (vLLM's scoring with an
    embedding model)."""
    first, second = score_pairs(data_1, data_2)
    n = len(first)
    outs = run_pooling(llm, first + second, pooling_params, "score", use_tqdm,
                       lora_request, truncate_prompt_tokens)
    return [ScoringRequestOutput(
        f"{a.request_id}_{b.request_id}",
        ScoringOutput(cosine(a.outputs.data, b.outputs.data)),
        a.prompt_token_ids + b.prompt_token_ids, True)
        for a, b in zip(outs[:n], outs[n:])]
