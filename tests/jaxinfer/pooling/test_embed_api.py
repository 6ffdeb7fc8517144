"""Embeddings through `LLM.embed` / `encode` / `score` equal HF
transformers' pooling (sentence-transformers' modules) within 1e-5, with
prompts chunked over several steps and batched together."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jaxinfer import LLM, PoolingParams
from jaxinfer.errors import InvalidRequestError, UnsupportedFeatureError

from .embedders import hf_embeddings, make_embedder

# 16-token steps: the longer prompts run over several chunks.
ENGINE = dict(dtype="float32", max_model_len=128, max_num_seqs=4,
              max_num_batched_tokens=16, block_size=16)


def _prompts(n=5, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(rng.choice([1, 7, 23, 50, 70]))]
            for _ in range(n)]


@pytest.fixture(scope="module")
def base_model(tiny_model_factory):
    return tiny_model_factory()


@pytest.mark.parametrize("pooling,normalize", [("MEAN", True), ("LAST", False),
                                               ("CLS", True)])
def test_embed_equals_hf_pooling(base_model, tmp_path, pooling, normalize):
    path = make_embedder(base_model, str(tmp_path / "m"), pooling, normalize)
    prompts = _prompts()
    llm = LLM(path, runner="pooling", **ENGINE)
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    want = hf_embeddings(path, prompts, pooling, normalize)
    for out, ids, ref in zip(outs, prompts, want):
        assert out.prompt_token_ids == ids
        np.testing.assert_allclose(out.outputs.embedding, ref, atol=1e-5,
                                   rtol=0)
    # Again (prefix caching is on by default): the same vectors; pooling
    # over every token computes the whole prompt (no cache hits).
    again = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for out, first in zip(again, outs):
        np.testing.assert_allclose(out.outputs.embedding, first.outputs.embedding,
                                   atol=1e-6, rtol=0)
    hits = llm.llm_engine.get_stats().prefix_cache_hits
    assert (hits > 0) == (pooling == "LAST")
    # The pages of every prompt are free again.
    kv = llm.llm_engine.scheduler.kv
    assert kv.pool.num_free == kv.pool.num_blocks - 1
    assert not llm.llm_engine.scheduler.has_unfinished_requests()


def test_defaults_without_sentence_transformers_files(base_model, tmp_path):
    """No modules.json: vLLM's defaults for a decoder embedder (last token,
    normalized); vLLM's older task='embed' name selects the runner."""
    path = make_embedder(base_model, str(tmp_path / "m"), None, False)
    prompts = _prompts(3, seed=1)
    llm = LLM(path, task="embed", **ENGINE)
    got = [o.outputs.embedding for o in llm.embed(
        [{"prompt_token_ids": p} for p in prompts], use_tqdm=False)]
    want = hf_embeddings(path, prompts, "LAST", True)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5, rtol=0)
    raw = llm.encode({"prompt_token_ids": prompts[0]},
                     PoolingParams(normalize=False), use_tqdm=False)[0]
    np.testing.assert_allclose(raw.outputs.data,
                               hf_embeddings(path, prompts[:1], "LAST", False)[0],
                               atol=1e-5, rtol=0)


def test_prefix_cache_and_text_prompts(base_model, tmp_path):
    """Last-token pooling reuses cached prefixes (the last token is always
    computed) and gives the same vectors; text prompts tokenize as HF's."""
    path = make_embedder(base_model, str(tmp_path / "m"), "LAST", True)
    llm = LLM(path, runner="pooling", enable_prefix_caching=True, **ENGINE)
    rng = random.Random(3)
    shared = [rng.randrange(3, 49152) for _ in range(51)]
    first = llm.embed({"prompt_token_ids": shared}, use_tqdm=False)[0]
    again = llm.embed({"prompt_token_ids": shared}, use_tqdm=False)[0]
    assert llm.llm_engine.get_stats().prefix_cache_hits >= 32
    np.testing.assert_allclose(again.outputs.embedding, first.outputs.embedding,
                               atol=1e-6, rtol=0)
    text = llm.embed("Hello embeddings", use_tqdm=False)[0]
    ids = llm.get_tokenizer()("Hello embeddings")["input_ids"]
    assert text.prompt_token_ids == list(ids)
    np.testing.assert_allclose(text.outputs.embedding,
                               hf_embeddings(path, [list(ids)], "LAST", True)[0],
                               atol=1e-5, rtol=0)


def test_dimensions_truncation_and_score(base_model, tmp_path):
    path = make_embedder(base_model, str(tmp_path / "m"), "MEAN", True,
                         is_matryoshka=True)
    llm = LLM(path, runner="pooling", **ENGINE)
    prompts = _prompts(3, seed=2)
    full = hf_embeddings(path, prompts, "MEAN", False)
    cut = llm.embed([{"prompt_token_ids": p} for p in prompts],
                    PoolingParams(dimensions=16), use_tqdm=False)
    for out, ref in zip(cut, full):  # cut first, then normalized (vLLM)
        want = ref[:16] / np.linalg.norm(ref[:16])
        np.testing.assert_allclose(out.outputs.embedding, want, atol=1e-5, rtol=0)
    # truncate_prompt_tokens keeps the last k tokens.
    last = llm.embed({"prompt_token_ids": prompts[0]}, use_tqdm=False,
                     truncate_prompt_tokens=5)[0]
    assert last.prompt_token_ids == prompts[0][-5:]
    # score: cosine of the normalized embeddings, one text against a list.
    scores = llm.score({"prompt_token_ids": prompts[0]},
                       [{"prompt_token_ids": p} for p in prompts[1:]],
                       use_tqdm=False)
    unit = [r / np.linalg.norm(r) for r in full]
    for s, other in zip(scores, unit[1:]):
        assert s.outputs.score == pytest.approx(float(unit[0] @ other), abs=1e-5)
        assert s.prompt_token_ids[:len(prompts[0])] == prompts[0]


def test_refusals(base_model, tmp_path):
    path = make_embedder(base_model, str(tmp_path / "m"), "MEAN", True)
    llm = LLM(path, runner="pooling", **ENGINE)
    with pytest.raises(InvalidRequestError, match="cannot generate"):
        llm.generate("hi", use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="Matryoshka"):
        llm.embed("hi", PoolingParams(dimensions=8), use_tqdm=False)
    with pytest.raises(UnsupportedFeatureError, match="activation"):
        PoolingParams(activation=True)
    with pytest.raises(UnsupportedFeatureError, match="classify task"):
        LLM(path, task="classify", **ENGINE)
    gen = LLM(base_model, **ENGINE)
    with pytest.raises(InvalidRequestError, match="runner='pooling'"):
        gen.embed("hi", use_tqdm=False)
    assert not llm.llm_engine.scheduler.has_unfinished_requests()
