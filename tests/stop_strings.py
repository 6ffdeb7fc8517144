"""Stop strings cut from a reference output: one inside a single token's
text, one across two tokens' texts (which one a stop string is depends on
where each token's text ends, read with the engine's own detokenizer)."""

from __future__ import annotations


def token_text_ends(tokenizer, prompt_token_ids, output_token_ids) -> list[int]:
    """Where each output token's text ends in the output text."""
    from jaxinfer import SamplingParams
    from jaxinfer.engine.detokenizer import IncrementalDetokenizer
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, SamplingParams())
    ends = []
    for tok in output_token_ids:
        detok.step(tok)
        ends.append(len(detok.text))
    return ends


def stop_inside_one_token(text: str, ends: list[int]) -> str | None:
    """Two characters in the middle of one token's text, first found there."""
    for start, end in zip([0] + ends, ends):
        if start > 0 and end - start >= 4:
            stop = text[start + 1:start + 3]
            if text.find(stop) == start + 1 and stop.strip():
                return stop
    return None


def stop_spanning_tokens(text: str, ends: list[int]) -> str | None:
    """Two characters of one token's text and two of the next's."""
    for prev, cut, nxt in zip(ends, ends[1:], ends[2:]):
        if cut - prev >= 2 and nxt - cut >= 2 and cut > 2:
            stop = text[cut - 2:cut + 2]
            if text.find(stop) == cut - 2:
                return stop
    return None
