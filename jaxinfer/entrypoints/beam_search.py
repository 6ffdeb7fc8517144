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


def beam_search(llm, prompts, params: BeamSearchParams,
                use_tqdm: bool = False) -> list[BeamSearchOutput]:
    engine = llm.llm_engine
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    eos = set(engine.eos_token_ids)
    width = params.beam_width
    step_params = SamplingParams(logprobs=2 * width, max_tokens=1,
                                 temperature=params.temperature)

    def score(beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, eos,
                                     params.length_penalty)

    running: list[list[BeamSearchSequence]] = []
    completed: list[list[BeamSearchSequence]] = []
    for p in prompts:
        _, ids = engine._tokenize(p)
        running.append([BeamSearchSequence(tokens=ids, logprobs=[])])
        completed.append([])
    steps = range(params.max_tokens)
    if use_tqdm:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc="Beam search")
    for _ in steps:
        beams = [b for inst in running for b in inst]
        if not beams:
            break
        outs = llm.generate([{"prompt_token_ids": b.tokens} for b in beams],
                            step_params, use_tqdm=False)
        k = 0
        for i, inst in enumerate(running):
            new = []
            for beam in inst:
                lp = outs[k].outputs[0].logprobs
                k += 1
                if not lp:
                    continue
                for tok, obj in lp[0].items():
                    cand = BeamSearchSequence(
                        tokens=beam.tokens + [tok],
                        logprobs=beam.logprobs + [lp[0]],
                        cum_logprob=beam.cum_logprob + obj.logprob)
                    if tok in eos and not params.ignore_eos:
                        cand.finish_reason, cand.stop_reason = "stop", tok
                        completed[i].append(cand)
                    else:
                        new.append(cand)
            running[i] = sorted(new, key=score, reverse=True)[:width]
    tok = engine.tokenizer
    results = []
    for inst, done in zip(running, completed):
        for beam in inst:
            beam.finish_reason = "length"
        best = sorted(done + inst, key=score, reverse=True)[:width]
        for beam in best:
            beam.text = tok.decode(beam.tokens, skip_special_tokens=True)
        results.append(BeamSearchOutput(sequences=best))
    return results


def beam_search_as_outputs(llm, prompts, params: SamplingParams,
                           request_ids: list[str]) -> list[RequestOutput]:
    """``SamplingParams(use_beam_search=True)`` through ``generate``: a beam
    search of width ``best_of`` (else ``n``) whose ``n`` best beams become
    the CompletionOutputs of one RequestOutput per prompt."""
    width = params.best_of or params.n
    beams = beam_search(llm, prompts, BeamSearchParams(
        beam_width=width, max_tokens=params.max_tokens or llm.llm_engine.max_model_len,
        ignore_eos=params.ignore_eos, temperature=params.temperature,
        length_penalty=params.length_penalty,
        include_stop_str_in_output=params.include_stop_str_in_output))
    tok = llm.llm_engine.tokenizer
    outputs = []
    for rid, prompt, result in zip(request_ids, prompts, beams):
        text, ids = llm.llm_engine._tokenize(prompt)
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
