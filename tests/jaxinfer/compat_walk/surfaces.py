"""One way to ask for samples through each surface that takes sampling
fields: the offline ``LLM`` (SamplingParams), ``/v1/completions`` and
``/v1/chat/completions``. A check written against ``Surface.run`` proves a
field on all three: that the server maps the field onto the engine, not
only that the engine has it."""

from __future__ import annotations

import dataclasses

import requests

MODEL = "tiny"  # the served model name of the walk's server


@dataclasses.dataclass
class Sample:
    """One finished sample, in the same shape from every surface."""
    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_token_ids: list[int]
    # Per output token: token id -> logprob (the sampled token and the top
    # candidates asked for); None unless logprobs were asked for.
    logprobs: list[dict[int, float]] | None = None
    # Per prompt token (the first None); None unless asked for.
    prompt_logprobs: list[dict[int, float] | None] | None = None


class Surface:
    name = ""

    def run(self, prompt: str, **fields) -> list[Sample]:
        """The samples of one request for ``prompt`` with vLLM's sampling
        ``fields`` (SamplingParams names; ``logprobs`` is an int)."""
        raise NotImplementedError


class OfflineSurface(Surface):
    name = "offline"

    def __init__(self, llm):
        self.llm = llm

    def run(self, prompt, **fields):
        from jaxinfer import SamplingParams
        out = self.llm.generate(prompt, SamplingParams(**fields),
                                use_tqdm=False)[0]
        plp = out.prompt_logprobs
        return [Sample(
            c.text, list(c.token_ids), c.finish_reason, list(out.prompt_token_ids),
            None if c.logprobs is None else
            [{t: e.logprob for t, e in d.items()} for d in c.logprobs],
            None if plp is None else
            [None if d is None else {t: e.logprob for t, e in d.items()}
             for d in plp]) for c in out.outputs]


def _token_id(token: str) -> int:
    assert token.startswith("token_id:"), token  # return_tokens_as_token_ids
    return int(token[len("token_id:"):])


def _prompt_logprobs(plp):
    if plp is None:
        return None
    return [None if d is None else {int(t): e["logprob"] for t, e in d.items()}
            for d in plp]


class _Server(Surface):
    path = ""

    def __init__(self, base_url: str):
        self.base_url = base_url

    def post(self, body: dict) -> requests.Response:
        return requests.post(self.base_url + self.path, json=body, timeout=300)

    def run(self, prompt, **fields):
        body = {"model": MODEL, "return_token_ids": True,
                "return_tokens_as_token_ids": True, **self.body(prompt, fields)}
        r = self.post(body)
        assert r.status_code == 200, (body, r.text)
        return self.samples(r.json())


class CompletionSurface(_Server):
    name = "completions"
    path = "/v1/completions"

    def body(self, prompt, fields):
        return {"prompt": prompt, **fields}

    def samples(self, resp):
        out = []
        for c in resp["choices"]:
            lp = c.get("logprobs")
            logprobs = None if lp is None else [
                {**{_token_id(t): v for t, v in (top or {}).items()},
                 _token_id(tok): v}
                for tok, v, top in zip(lp["tokens"], lp["token_logprobs"],
                                       lp["top_logprobs"])]
            out.append(Sample(c["text"], c["token_ids"], c["finish_reason"],
                              c["prompt_token_ids"], logprobs,
                              _prompt_logprobs(c.get("prompt_logprobs"))))
        return out


class ChatSurface(_Server):
    name = "chat"
    path = "/v1/chat/completions"

    def body(self, prompt, fields):
        fields = dict(fields)
        if fields.get("logprobs") is not None:  # chat spells top-k apart
            fields["top_logprobs"] = fields["logprobs"]
            fields["logprobs"] = True
        return {"messages": [{"role": "user", "content": prompt}], **fields}

    def samples(self, resp):
        out = []
        for c in resp["choices"]:
            lp = (c.get("logprobs") or {}).get("content")
            logprobs = None if lp is None else [
                {**{_token_id(t["token"]): t["logprob"] for t in e["top_logprobs"]},
                 _token_id(e["token"]): e["logprob"]} for e in lp]
            out.append(Sample(c["message"]["content"], c["token_ids"],
                              c["finish_reason"], resp["prompt_token_ids"],
                              logprobs, _prompt_logprobs(resp.get("prompt_logprobs"))))
        return out
