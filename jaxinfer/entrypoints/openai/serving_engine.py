"""What the completion and chat handlers share: model-name checks, OpenAI
fields -> `SamplingParams`, context-length checks, logprob formatting, merging
the streams of several requests, collecting their choices and usage, and
aborting on client disconnect."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from ...engine.engine_client import EngineClient
from ...engine.input_processor import check_context_length, check_token_ids
from ...errors import InvalidRequestError
from ...lora.request import LoRARequest
from ...outputs import CompletionOutput, RequestOutput
from ...sampling_params import SamplingParams
from .errors import APIError
from .protocol import SamplingFields, UsageInfo
from .serving_models import ServingModels
from .serving_structured import structured_outputs

# Logprobs are JSON numbers; -inf (a masked token) is sent as vLLM sends it.
MIN_LOGPROB = -9999.0


@dataclasses.dataclass
class Choice:
    """One completion assembled from DELTA outputs."""
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[dict] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, delta: CompletionOutput) -> tuple[list[int], list[dict]]:
        """Appends a delta; returns its tokens and their logprob dicts."""
        self.text += delta.text
        self.token_ids += delta.token_ids
        lps = new_logprobs(delta)
        self.logprobs += lps
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason
        return delta.token_ids, lps


def new_logprobs(delta: CompletionOutput) -> list[dict]:
    """The logprob dicts of a delta's tokens (tolerates engines that send the
    cumulative list in delta mode)."""
    lps = delta.logprobs or []
    return list(lps[len(lps) - len(delta.token_ids):]) if lps else []


def logprob_value(entry) -> float:
    value = entry if isinstance(entry, (int, float)) else entry.logprob
    return max(float(value), MIN_LOGPROB)


def ranked(entries: dict, k: int) -> list[tuple[int, Any]]:
    """The top k (token id, entry) pairs of one position, best first."""
    def key(item):
        rank = getattr(item[1], "rank", None)
        return (rank if rank is not None else 0, -logprob_value(item[1]))
    return sorted(entries.items(), key=key)[:k]


class OpenAIServing:
    def __init__(self, engine: EngineClient, served_model_names: list[str],
                 models: ServingModels | None = None):
        self.engine = engine
        self.served_model_names = served_model_names
        # The names requests may give: base model and LoRA adapters.
        self.models = models or ServingModels(engine, served_model_names)
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.max_num_seqs = engine.model.max_num_seqs
        self.vocab_size = engine.model.vocab_size

    # Server-wide default of return_tokens_as_token_ids (the flag).
    return_tokens_as_token_ids = False

    def check_model(self, name: str | None) -> str:
        return self.resolve_model(name)[0]

    def resolve_model(self, name: str | None) -> tuple[str, LoRARequest | None]:
        """(the model name to report, the LoRA adapter it names or None);
        404 for a name the server does not serve ("" as vLLM: the default)."""
        if not name:
            return self.served_model_names[0], None
        return self.models.resolve(name)

    def token_text(self, token_id: int, entry=None, as_id: bool = False) -> str:
        """A token as logprobs show it: its text, or ``token_id:{id}`` with
        return_tokens_as_token_ids (text that is not valid UTF-8 alone)."""
        if as_id:
            return f"token_id:{token_id}"
        text = getattr(entry, "decoded_token", None)
        if text is None:
            text = self.tokenizer.decode([token_id])
        return text

    def tokens_as_ids(self, req: SamplingFields) -> bool:
        if req.return_tokens_as_token_ids is None:
            return self.return_tokens_as_token_ids
        return req.return_tokens_as_token_ids

    def num_logprobs(self, field: str, value: int | None) -> int | None:
        """vLLM's -1 (the whole vocabulary), then bounded by max_logprobs
        when the request is checked."""
        return self.vocab_size if value == -1 else value

    def prompt_logprobs_json(self, prompt_ids: list[int], lps,
                             as_id: bool = False) -> list | None:
        """vLLM's prompt_logprobs: per prompt token None (the first) or
        {token id: {logprob, rank, decoded_token}}."""
        if lps is None:
            return None
        out: list[dict | None] = []
        for entries in lps[:len(prompt_ids)]:
            if entries is None:
                out.append(None)
                continue
            out.append({str(t): {"logprob": logprob_value(e),
                                 "rank": getattr(e, "rank", None),
                                 "decoded_token": self.token_text(t, e, as_id)}
                        for t, e in entries.items()})
        return out

    def check_ids(self, field: str, ids) -> list[int]:
        try:
            return check_token_ids(field, ids or [], self.vocab_size)
        except InvalidRequestError as e:
            raise APIError(str(e), param=field) from None

    def sampling_params(self, req: SamplingFields, max_tokens: int | None,
                        logprobs: int | None, prompt_len: int) -> SamplingParams:
        """Maps the request onto SamplingParams; raises APIError (400) for
        values the engine cannot serve, naming the limit. The engine's
        `InputProcessor` checks the rest when the request is added."""
        try:
            check_context_length(prompt_len, max_tokens, self.max_model_len)
        except InvalidRequestError as e:
            raise APIError(str(e), param="prompt" if prompt_len >= self.max_model_len
                           else "max_tokens") from None
        room = self.max_model_len - prompt_len
        self.check_ids("stop_token_ids", req.stop_token_ids)
        self.check_ids("allowed_token_ids", req.allowed_token_ids)
        logit_bias = None
        if req.logit_bias:
            bad = [k for k in req.logit_bias if not k.strip().lstrip("-").isdigit()]
            if bad:
                raise APIError(
                    f"logit_bias keys must be token ids (integers); not "
                    f"{', '.join(map(repr, bad[:5]))}", param="logit_bias")
            logit_bias = {int(k): v for k, v in req.logit_bias.items()}
            self.check_ids("logit_bias", list(logit_bias))
        kwargs: dict[str, Any] = dict(
            n=req.n, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, seed=req.seed,
            stop=req.stop, stop_token_ids=req.stop_token_ids,
            bad_words=req.bad_words or None, ignore_eos=req.ignore_eos,
            max_tokens=room if max_tokens is None else max_tokens,
            min_tokens=req.min_tokens,
            logprobs=self.num_logprobs("logprobs", logprobs),
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logit_bias=logit_bias, allowed_token_ids=req.allowed_token_ids,
            best_of=req.best_of, use_beam_search=req.use_beam_search,
            length_penalty=req.length_penalty,
            prompt_logprobs=self.num_logprobs("prompt_logprobs",
                                              req.prompt_logprobs))
        kwargs["structured_outputs"] = structured_outputs(req)
        try:
            return SamplingParams.from_optional(**kwargs)
        except ValueError as e:
            raise APIError(str(e), param=str(e).split(" ", 1)[0]) from None


async def add_all(engine: EngineClient, request_id: str,
                  prompts: list[tuple[str | None, list[int]]],
                  params: list[SamplingParams], priority: int = 0,
                  multi_modal_data: list | None = None,
                  lora_request: LoRARequest | None = None
                  ) -> list[AsyncIterator[RequestOutput]]:
    """Adds one engine request per prompt (ids ``{request_id}-{i}``); if one
    is refused, the ones already added are aborted and the error raised.
    ``multi_modal_data``: per prompt, its images ({"image": [...]}) or None."""
    streams = []
    try:
        for i, ((text, ids), sp) in enumerate(zip(prompts, params)):
            prompt: dict = {"prompt": text, "prompt_token_ids": ids}
            if multi_modal_data and multi_modal_data[i] is not None:
                prompt["multi_modal_data"] = multi_modal_data[i]
            streams.append(await engine.add_request(
                f"{request_id}-{i}", prompt, sp, lora_request=lora_request,
                priority=priority))
    except BaseException:
        for s in streams:
            engine.abort(s.request_id)
        raise
    return [engine.iterate(s) for s in streams]


async def merge_streams(gens: list[AsyncIterator[RequestOutput]]
                        ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleaves several requests' outputs as they come: (index, output).
    Closing the merged iterator cancels (and so aborts) all of them."""
    if len(gens) == 1:
        async for out in gens[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, gen):
        try:
            async for out in gen:
                await queue.put((i, out))
        except BaseException as e:  # noqa: BLE001 - re-raised by the reader
            await queue.put((i, e))
            return
        await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def cancel_on_disconnect(raw_request: Request):
    """Runs the body; if the client hangs up first, cancels it (which aborts
    its requests through the generators' cleanup) and raises CancelledError."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("cancel_on_disconnect runs inside a task")
    disconnected = False

    async def watch():
        nonlocal disconnected
        while True:
            message = await raw_request.receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def usage_counter(choices: dict[Any, Choice], num_prompt_tokens: int):
    """A function giving the usage so far: the prompt tokens and every
    choice's completion tokens."""
    def usage() -> UsageInfo:
        done = sum(len(c.token_ids) for c in choices.values())
        return UsageInfo(prompt_tokens=num_prompt_tokens,
                         completion_tokens=done,
                         total_tokens=num_prompt_tokens + done)
    return usage


async def collect_choices(gens: list[AsyncIterator[RequestOutput]],
                          raw_request: Request, choices: dict[Any, Choice],
                          key, prompt_logprobs: dict | None = None) -> bool:
    """Adds every output of the merged requests to ``choices[key(i, j)]``
    (request i, its choice j) until all finish; request i's prompt logprobs
    go to ``prompt_logprobs[i]``. False if the client hung up first (the
    requests are then aborted)."""
    try:
        async with cancel_on_disconnect(raw_request):
            async for i, out in merge_streams(gens):
                if prompt_logprobs is not None and out.prompt_logprobs:
                    prompt_logprobs[i] = out.prompt_logprobs
                for c in out.outputs:
                    choices[key(i, c.index)].add(c)
    except asyncio.CancelledError:
        return False
    return True


def engine_lifespan(engine: EngineClient, owns_engine: bool):
    """A FastAPI lifespan that runs the engine loop while the app serves
    (and stops it after, when the app owns the engine)."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        engine.start()
        yield
        if owns_engine:
            engine.shutdown()
    return lifespan


async def beam_choices(engine: EngineClient, request_id: str,
                       prompts: list[tuple[str | None, list[int]]],
                       params: list[SamplingParams], n: int,
                       length_penalty: float, temperature: float,
                       raw_request: Request,
                       lora_request: LoRARequest | None = None) -> dict | None:
    """``use_beam_search``: per prompt i a beam search of width best_of (else
    n); its n best beams become ``choices[(i, j)]``. None if the client hung
    up first (the beams' requests are then aborted)."""
    from ...sampling_params import BeamSearchParams
    from ..beam_search import beam_search_async
    choices: dict[tuple[int, int], Choice] = {}

    async def search(i: int, ids: list[int], sp: SamplingParams) -> None:
        result = await beam_search_async(engine, ids, BeamSearchParams(
            beam_width=sp.best_of or sp.n,
            max_tokens=sp.max_tokens or engine.max_model_len,
            ignore_eos=sp.ignore_eos, temperature=temperature,
            length_penalty=length_penalty), f"{request_id}-{i}",
            lora_request=lora_request)
        for j, beam in enumerate(result.sequences[:n]):
            gen = beam.tokens[len(ids):]
            choices[(i, j)] = Choice(
                text=engine.tokenizer.decode(
                    gen, skip_special_tokens=sp.skip_special_tokens),
                token_ids=gen, logprobs=list(beam.logprobs),
                finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)

    try:
        async with cancel_on_disconnect(raw_request):
            await asyncio.gather(*(search(i, ids, sp) for i, ((_, ids), sp)
                                   in enumerate(zip(prompts, params))))
    except asyncio.CancelledError:
        return None
    return choices
