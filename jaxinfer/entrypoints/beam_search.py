"""`LLM.beam_search`, as vLLM's: each step runs every live beam for one
token with ``logprobs = 2 * beam_width``, extends each beam by each of those
candidates, and keeps the ``beam_width`` best by length-penalized score;
beams ending in EOS are set aside as completed.

Pages are shared between beams through the prefix cache: a beam's tokens
extend its parent's, so every full page of the common prefix is a cache hit
(the same ref-counted page) and only the last, partly filled page is
recomputed per beam and step. Without prefix caching it is still correct,
only slower.
"""

from __future__ import annotations

import dataclasses

from ..logprobs import Logprob
from ..lora.request import per_prompt
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams


@dataclasses.dataclass
class BeamSearchSequence:
    tokens: list[int]  # prompt + generated tokens
    logprobs: list[dict[int, Logprob]]  # per generated token
    cum_logprob: float = 0.0  # sum of the generated tokens' logprobs
    text: str | None = None  # the decoded tokens (prompt included)
    finish_reason: str | None = None  # "stop" (EOS) or "length"
    stop_reason: int | str | None = None


@dataclasses.dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first, at most beam_width


def get_beam_search_score(tokens: list[int], cumulative_logprob: float,
                          eos_token_ids, length_penalty: float = 1.0) -> float:
    """vLLM's score: cumulative logprob / length ** length_penalty, where the
    length counts all tokens but a final EOS."""
    seq_len = len(tokens)
    if tokens[-1] in eos_token_ids:
        seq_len -= 1
    return cumulative_logprob / (seq_len ** length_penalty)


class BeamSearchState:
    """The beams of several prompts between steps: which to extend next
    (``live``), how to extend them from one step's logprobs (``advance``),
    and the best ``beam_width`` at the end (``results``). The sync and the
    async search drive it the same way."""

    def __init__(self, prompt_ids: list[list[int]], params: BeamSearchParams,
                 eos_token_ids):
        self.params = params
        self.eos = set(eos_token_ids)
        self.running = [[BeamSearchSequence(tokens=list(ids), logprobs=[])]
                        for ids in prompt_ids]
        self.completed: list[list[BeamSearchSequence]] = [[] for _ in prompt_ids]
        # Each step: one token per beam, with 2 x width candidates.
        self.step_params = SamplingParams(logprobs=2 * params.beam_width,
                                          max_tokens=1,
                                          temperature=params.temperature)

    def score(self, beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, self.eos,
                                     self.params.length_penalty)

    def live(self) -> list[BeamSearchSequence]:
        return [b for inst in self.running for b in inst]

    def live_owner(self) -> list[int]:
        """The prompt of each beam ``live()`` lists."""
        return [i for i, inst in enumerate(self.running) for _ in inst]

    def advance(self, step_logprobs: list) -> None:
        """``step_logprobs[k]``: the ``{token: Logprob}`` of live beam k's
        next position (None or empty: that beam got nothing)."""
        k = 0
        for i, inst in enumerate(self.running):
            new = []
            for beam in inst:
                lp = step_logprobs[k]
                k += 1
                for tok, obj in (lp or {}).items():
                    cand = BeamSearchSequence(
                        tokens=beam.tokens + [tok],
                        logprobs=beam.logprobs + [lp],
                        cum_logprob=beam.cum_logprob + obj.logprob)
                    if tok in self.eos and not self.params.ignore_eos:
                        cand.finish_reason, cand.stop_reason = "stop", tok
                        self.completed[i].append(cand)
                    else:
                        new.append(cand)
            self.running[i] = sorted(new, key=self.score,
                                     reverse=True)[:self.params.beam_width]

    def results(self, tokenizer) -> list[BeamSearchOutput]:
        out = []
        for inst, done in zip(self.running, self.completed):
            for beam in inst:
                beam.finish_reason = "length"
            best = sorted(done + inst, key=self.score,
                          reverse=True)[:self.params.beam_width]
            for beam in best:
                beam.text = tokenizer.decode(beam.tokens, skip_special_tokens=True)
            out.append(BeamSearchOutput(sequences=best))
        return out


def beam_search(llm, prompts, params: BeamSearchParams,
                use_tqdm: bool = False,
                lora_request=None) -> list[BeamSearchOutput]:
    """``lora_request``: one LoRARequest for all prompts or one per prompt;
    every beam of a prompt runs with its prompt's adapter."""
    engine = llm.llm_engine
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    loras = per_prompt(lora_request, len(prompts))
    state = BeamSearchState([engine.input_processor.tokenize_prompt(p)[1]
                             for p in prompts], params,
                            engine.eos_token_ids)
    steps = range(params.max_tokens)
    if use_tqdm:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc="Beam search")
    for _ in steps:
        beams = state.live()
        if not beams:
            break
        outs = llm.generate([{"prompt_token_ids": b.tokens} for b in beams],
                            state.step_params, use_tqdm=False,
                            lora_request=[loras[i] for i in state.live_owner()])
        state.advance([(o.outputs[0].logprobs or [None])[0] for o in outs])
    return state.results(engine.tokenizer)


async def beam_search_async(engine, prompt_ids: list[int],
                            params: BeamSearchParams, request_id: str,
                            lora_request=None) -> BeamSearchOutput:
    """The same search over an ``AsyncLLMEngine`` (the server's
    ``use_beam_search``): each step's beams run as concurrent requests."""
    import asyncio
    state = BeamSearchState([prompt_ids], params, engine.model.eos_token_ids)

    async def one(i: int, beam: BeamSearchSequence):
        last = None
        async for out in engine.generate({"prompt_token_ids": beam.tokens},
                                         state.step_params,
                                         f"{request_id}-beam{i}",
                                         lora_request=lora_request):
            last = out.outputs[0].logprobs or last
        return last[0] if last else None

    for step in range(params.max_tokens):
        beams = state.live()
        if not beams:
            break
        state.advance(await asyncio.gather(
            *(one(step * 1000 + i, b) for i, b in enumerate(beams))))
    return state.results(engine.tokenizer)[0]


def beam_search_as_outputs(llm, prompts, params: SamplingParams,
                           request_ids: list[str],
                           lora_request=None) -> list[RequestOutput]:
    """``SamplingParams(use_beam_search=True)`` through ``generate``: a beam
    search of width ``best_of`` (else ``n``) whose ``n`` best beams become
    the CompletionOutputs of one RequestOutput per prompt."""
    width = params.best_of or params.n
    beams = beam_search(llm, prompts, BeamSearchParams(
        beam_width=width, max_tokens=params.max_tokens or llm.llm_engine.max_model_len,
        ignore_eos=params.ignore_eos, temperature=params.temperature,
        length_penalty=params.length_penalty,
        include_stop_str_in_output=params.include_stop_str_in_output),
        lora_request=lora_request)
    tok = llm.llm_engine.tokenizer
    outputs = []
    for rid, prompt, result in zip(request_ids, prompts, beams):
        text, ids = llm.llm_engine.input_processor.tokenize_prompt(prompt)
        comps = []
        for i, beam in enumerate(result.sequences[:params.n]):
            gen = beam.tokens[len(ids):]
            comps.append(CompletionOutput(
                index=i, text=tok.decode(
                    gen, skip_special_tokens=params.skip_special_tokens),
                token_ids=gen, cumulative_logprob=beam.cum_logprob,
                logprobs=beam.logprobs if params.logprobs is not None else None,
                finish_reason=beam.finish_reason, stop_reason=beam.stop_reason))
        outputs.append(RequestOutput(request_id=rid, prompt=text,
                                     prompt_token_ids=ids, outputs=comps,
                                     finished=True))
    return outputs
