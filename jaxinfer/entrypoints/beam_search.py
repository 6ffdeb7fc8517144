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
        _, ids = engine.input_processor.tokenize_prompt(p)
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
