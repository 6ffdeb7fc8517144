"""`/v1/embeddings` through the official openai client (float and base64),
`/pooling` and `/score`, on the single-process server and on `jaxinfer
serve`'s split one (front end and engine core in separate processes):
equal to HF transformers' pooling within 1e-5; bad input answered 400 in
OpenAI's error shape."""

from __future__ import annotations

import random

import numpy as np
import pytest
import requests

from tests.tiny_models import embedded_tokenizer

from ..entrypoints.conftest import openai_client, pages_all_free, start_server
from .embedders import hf_embeddings, make_embedder

ENGINE = dict(dtype="float32", max_model_len=128, max_num_seqs=4,
              max_num_batched_tokens=16, block_size=16)
TEXT = "Embeddings of a tiny model"


def _ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(n)]


@pytest.fixture(scope="module")
def embedder(tiny_model_factory, tmp_path_factory):
    return make_embedder(tiny_model_factory(),
                         str(tmp_path_factory.mktemp("emb") / "m"), "MEAN", True)


@pytest.fixture(scope="module")
def server(embedder):
    srv, engine = start_server(embedder, ["emb"], runner="pooling", **ENGINE)
    yield srv, engine
    srv.stop()
    engine.shutdown()


def _check_openai_embeddings(base_url_server, embedder):
    client = openai_client(base_url_server)
    prompts = [_ids(40, 1), _ids(9, 2)]
    text_ids = list(embedded_tokenizer().encode(TEXT, add_special_tokens=True))
    want = hf_embeddings(embedder, prompts + [text_ids], "MEAN", True)
    # The client asks for base64 unless told otherwise, and decodes it.
    b64 = client.embeddings.create(model="emb", input=prompts)
    flt = client.embeddings.create(model="emb", input=prompts,
                                   encoding_format="float")
    for resp in (b64, flt):
        assert [d.index for d in resp.data] == [0, 1]
        for d, ref in zip(resp.data, want):
            np.testing.assert_allclose(d.embedding, ref, atol=1e-5, rtol=0)
        assert resp.usage.prompt_tokens == resp.usage.total_tokens == 49
    text = client.embeddings.create(model="emb", input=TEXT,
                                    encoding_format="float")
    np.testing.assert_allclose(text.data[0].embedding, want[2], atol=1e-5, rtol=0)


def test_openai_client_embeddings_equal_hf(server, embedder):
    srv, engine = server
    _check_openai_embeddings(srv, embedder)
    assert pages_all_free(engine)


def test_pooling_and_score_routes(server, embedder):
    srv, _ = server
    a = _ids(30, 3)
    raw = hf_embeddings(embedder, [a], "MEAN", False)[0]
    r = requests.post(srv.base_url + "/pooling", json={
        "model": "emb", "input": a, "normalize": False}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["data"][0]["object"] == "pooling"
    np.testing.assert_allclose(body["data"][0]["data"], raw, atol=1e-5, rtol=0)
    # /score (and /v1/score): one text against each of a list, the cosine
    # of HF's embeddings.
    texts = ["first text", "second text", "third one"]
    ids = [list(embedded_tokenizer().encode(t, add_special_tokens=True))
           for t in texts]
    e = hf_embeddings(embedder, ids, "MEAN", True)
    for route in ("/score", "/v1/score"):
        r = requests.post(srv.base_url + route, json={
            "model": "emb", "text_1": texts[0], "text_2": texts[1:]},
            timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["index"] for d in data] == [0, 1]
        for d, other in zip(data, e[1:]):
            assert d["score"] == pytest.approx(float(e[0] @ other), abs=1e-5)
    r = requests.post(srv.base_url + "/score", json={
        "text_1": texts[:2], "text_2": texts}, timeout=60)
    assert r.status_code == 400 and "one to one" in r.json()["error"]["message"]


@pytest.mark.parametrize("body,fragment", [
    ({"input": []}, "input must not be empty"),
    ({"input": "hi", "dimensions": 8}, "Matryoshka"),
    ({"input": "hi", "encoding_format": "bytes"}, "encoding_format"),
    ({"input": [[1, 2], [49152]]}, "outside the vocabulary"),
    ({"input": "hi", "model": "nope"}, "does not exist"),
    ({"input": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
])
def test_bad_embedding_requests_are_400(server, body, fragment):
    srv, engine = server
    r = requests.post(srv.base_url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["code"] == r.status_code
    assert pages_all_free(engine)


def test_generation_refused_on_a_pooling_server(server):
    srv, _ = server
    r = requests.post(srv.base_url + "/v1/completions",
                      json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 400
    assert "cannot generate" in r.json()["error"]["message"]


def test_embeddings_refused_on_a_generate_server(tiny_model_factory):
    srv, engine = start_server(tiny_model_factory(), ["gen"], **ENGINE)
    try:
        r = requests.post(srv.base_url + "/v1/embeddings",
                          json={"input": "hi"}, timeout=60)
        assert r.status_code == 400
        assert "runner='pooling'" in r.json()["error"]["message"]
    finally:
        srv.stop()
        engine.shutdown()


def test_split_server_embeddings_equal_hf(embedder, tmp_path):
    """`jaxinfer serve --runner pooling`: the engine core in its own
    process; pooled vectors cross to the front end as msgspec structs."""
    from ..entrypoints.cli_server import CliServer
    srv = CliServer(embedder, tmp_path, "--runner", "pooling", "--dtype",
                    "float32", "--max-model-len", "128",
                    "--max-num-batched-tokens", "16", "--max-num-seqs", "4")
    try:
        srv_named = type("S", (), {"base_url": srv.base_url})()
        client = openai_client(srv_named)
        prompts = [_ids(40, 1), _ids(9, 2)]
        want = hf_embeddings(embedder, prompts, "MEAN", True)
        resp = client.embeddings.create(model="tiny", input=prompts)
        for d, ref in zip(resp.data, want):
            np.testing.assert_allclose(d.embedding, ref, atol=1e-5, rtol=0)
        r = requests.post(srv.base_url + "/v1/embeddings",
                          json={"input": "hi", "dimensions": 4}, timeout=60)
        assert r.status_code == 400 and "Matryoshka" in r.json()["error"]["message"]
        r = requests.post(srv.base_url + "/v1/completions",
                          json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 400, r.text
    finally:
        srv.stop()
