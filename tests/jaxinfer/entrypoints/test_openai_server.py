"""The OpenAI-compatible server on a tiny model, driven by the official
`openai` client: results equal `LLM.generate` / `LLM.chat`, streaming equals
non-streaming, and bad input gets OpenAI-shaped 400/404 errors."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest
import requests

from jaxinfer import LLM, SamplingParams

from .conftest import openai_client, pages_all_free

# The in-process and the multi-process server (conftest.py).
pytestmark = pytest.mark.both_servers

PROMPTS = ["Hello, my name is", "The capital of France is",
           "In a hole in the ground there lived"]
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    return LLM(tiny_model_factory(), max_model_len=128,
               num_gpu_blocks_override=256, max_num_seqs=8,
               max_num_batched_tokens=128)


def test_greedy_completions_equal_llm_generate(client, llm):
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    want = [o.outputs[0] for o in llm.generate(PROMPTS, sp, use_tqdm=False)]
    # One request per prompt, concurrently, then one batched request.
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: client.completions.create(
            model="tiny", prompt=p, max_tokens=12, temperature=0), PROMPTS))
    for resp, w in zip(got, want):
        assert resp.choices[0].text == w.text
        assert resp.choices[0].finish_reason == w.finish_reason
        assert resp.usage.completion_tokens == len(w.token_ids)
    batch = client.completions.create(model="tiny", prompt=PROMPTS,
                                      max_tokens=12, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [w.text for w in want]


def test_token_id_prompt(client, llm):
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    sp = SamplingParams(temperature=0.0, max_tokens=8)
    want = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
    resp = client.completions.create(model="tiny", prompt=ids, max_tokens=8,
                                     temperature=0)
    assert resp.choices[0].text == want[0].outputs[0].text
    assert resp.usage.prompt_tokens == len(ids)


def test_greedy_chat_equals_llm_chat(client, llm):
    sp = SamplingParams(temperature=0.0, max_tokens=10)
    want = llm.chat(CHAT, sp, use_tqdm=False)[0]
    resp = client.chat.completions.create(model="tiny", messages=CHAT,
                                          max_completion_tokens=10, temperature=0)
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == want.outputs[0].text
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
    old_name = client.chat.completions.create(model="tiny", messages=CHAT,
                                              max_tokens=10, temperature=0)
    assert old_name.choices[0].message.content == want.outputs[0].text


def test_chat_streaming_equals_non_streaming(client):
    kw = dict(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage


def test_completion_streaming_sse_ends_with_done(server, client):
    kw = dict(model="tiny", prompt=PROMPTS[1], max_tokens=10, temperature=0)
    full = client.completions.create(**kw)
    r = requests.post(server.base_url + "/v1/completions",
                      json=dict(kw, stream=True), stream=True, timeout=60)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert all(c.usage is None for c in chunks)  # no include_usage asked


def test_stop_string_and_stop_token(client):
    base = client.completions.create(model="tiny", prompt=PROMPTS[2],
                                     max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), "the chosen stop string must be visible text"
    resp = client.completions.create(model="tiny", prompt=PROMPTS[2],
                                     max_tokens=12, temperature=0, stop=[stop])
    assert resp.choices[0].text == text[:text.index(stop)]
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].stop_reason == stop
    chunks = list(client.completions.create(
        model="tiny", prompt=PROMPTS[2], max_tokens=12, temperature=0,
        stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text[:text.index(stop)]


def test_stream_never_shows_text_a_long_stop_string_removes(client):
    """A stop string longer than the text so far must hold all of it back."""
    kw = dict(model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=0,
              logprobs=0, extra_body={"ignore_eos": True})
    tokens = client.completions.create(**kw).choices[0].logprobs.tokens
    i = next(i for i in range(1, 7)
             if len("".join(tokens[:i])) >= 2 and len(tokens[i]) >= 2)
    # Matches at 0 once token i arrives; longer than the text before it.
    stop = "".join(tokens[:i]) + tokens[i][:2]
    del kw["logprobs"]
    full = client.completions.create(stop=[stop], **kw).choices[0]
    assert full.text == "" and full.finish_reason == "stop"
    chunks = list(client.completions.create(stop=[stop], stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == ""


def test_seed_reproducible_and_equal_to_llm(client, llm):
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=1.0,
              seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    c = client.completions.create(**dict(kw, seed=4321)).choices[0].text
    assert a == b
    assert a != c  # a random-weight model samples near-uniformly
    want = llm.generate(PROMPTS[0], SamplingParams(max_tokens=12, temperature=1.0,
                                                   seed=1234), use_tqdm=False)
    assert a == want[0].outputs[0].text


def test_completion_logprobs_match_llm(client, llm):
    want = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=6,
                                                   logprobs=3), use_tqdm=False)
    want = want[0].outputs[0]
    resp = client.completions.create(model="tiny", prompt=PROMPTS[0],
                                     max_tokens=6, temperature=0, logprobs=3)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(want.token_ids) == 6
    for i, (tid, entries) in enumerate(zip(want.token_ids, want.logprobs)):
        assert lp.token_logprobs[i] == pytest.approx(entries[tid].logprob, abs=1e-5)
        assert len(lp.top_logprobs[i]) == 3
        # greedy: the sampled token is the most likely one
        assert lp.token_logprobs[i] == pytest.approx(max(lp.top_logprobs[i].values()),
                                                     abs=1e-5)
    assert "".join(lp.tokens) == resp.choices[0].text
    assert lp.text_offset[0] == 0


def test_chat_logprobs_streaming_and_not(client):
    kw = dict(model="tiny", messages=CHAT, max_tokens=5, temperature=0,
              logprobs=True, top_logprobs=2)
    full = client.chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens == 5
    assert all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)
    streamed = [lp for ch in client.chat.completions.create(stream=True, **kw)
                if ch.choices and ch.choices[0].logprobs
                for lp in ch.choices[0].logprobs.content]
    assert [(c.token, round(c.logprob, 4)) for c in streamed] == \
        [(c.token, round(c.logprob, 4)) for c in content]


def test_n_greater_than_one(client, llm):
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=1.0,
              seed=7, n=3)
    resp = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    want = llm.generate(PROMPTS[0], SamplingParams(
        n=3, seed=7, temperature=1.0, max_tokens=6, ignore_eos=True),
        use_tqdm=False)[0]
    assert {c.index: c.text for c in resp.choices} == \
        {c.index: c.text for c in want.outputs}
    assert resp.usage.completion_tokens == 18
    assert len({c.text for c in resp.choices}) > 1  # independent samples
    chunks = list(client.completions.create(stream=True, **kw, extra_body={"ignore_eos": True}))
    streamed = {i: "".join(c.choices[0].text for c in chunks
                           if c.choices[0].index == i) for i in range(3)}
    assert streamed == {c.index: c.text for c in resp.choices}


def test_chat_n_streaming(client):
    kw = dict(model="tiny", messages=CHAT, max_tokens=5, temperature=0.8, seed=3,
              n=2)
    full = client.chat.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    for c in full.choices:
        deltas = [ch.choices[0] for ch in chunks if ch.choices[0].index == c.index]
        assert deltas[0].delta.role == "assistant"
        assert "".join(d.delta.content or "" for d in deltas) == c.message.content
        assert [d.finish_reason for d in deltas if d.finish_reason] == \
            [c.finish_reason]


def test_models_tokenize_detokenize_health_version(server, client, llm):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    base = server.base_url
    assert requests.get(base + "/health", timeout=10).status_code == 200
    assert "version" in requests.get(base + "/version", timeout=10).json()
    tok = requests.post(base + "/tokenize", json={"prompt": PROMPTS[0]},
                        timeout=10).json()
    assert tok["tokens"] == llm.get_tokenizer().encode(PROMPTS[0])
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 128
    chat_tok = requests.post(base + "/tokenize", json={"messages": CHAT},
                             timeout=10).json()
    want = llm.chat(CHAT, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert chat_tok["tokens"] == want.prompt_token_ids
    detok = requests.post(base + "/detokenize", json={"tokens": tok["tokens"]},
                          timeout=10).json()
    assert detok["prompt"] == PROMPTS[0]


def _error(resp, status):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    return err


@pytest.mark.parametrize("body, needle", [
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": 3}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "hi", "max_tokens": 500}, "maximum context length is 128"),
    ({"prompt": "word " * 200}, "maximum context length is 128"),
    ({"prompt": [1, 2, 10 ** 9]}, "vocabulary"),
    ({"prompt": "hi", "logprobs": 1000}, "logprobs"),
    ({"prompt": "hi", "seed": 2 ** 70}, "seed"),
    ({"prompt": "hi", "stop_token_ids": [-5]}, "stop_token_ids"),
])
def test_completion_bad_input_is_400(server, body, needle):
    resp = requests.post(server.base_url + "/v1/completions", json=body, timeout=30)
    err = _error(resp, 400)
    assert needle in err["message"] or err["param"] == needle
    assert err["type"] == "BadRequestError"


def test_chat_bad_input_is_400(server):
    url = server.base_url + "/v1/chat/completions"
    _error(requests.post(url, json={"messages": []}, timeout=10), 400)
    _error(requests.post(url, data=b"{not json", timeout=10,
                         headers={"content-type": "application/json"}), 400)
    err = _error(requests.post(url, json={"messages": CHAT, "top_logprobs": 2},
                               timeout=10), 400)
    assert "logprobs" in err["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)


def test_server_is_clean_afterwards(server, engine):
    assert pages_all_free(engine)
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
