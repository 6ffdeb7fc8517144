"""Beam search matches HF ``generate(num_beams=..., length_penalty=...,
do_sample=False)`` on a tiny model (sequences and scores)."""

from __future__ import annotations

import pytest
import torch

from jaxinfer import BeamSearchParams
from jaxinfer.entrypoints.beam_search import get_beam_search_score

PROMPTS = [[1, 700, 701, 702, 703], [1, 42, 43, 44, 45, 46, 47, 48, 49, 50,
                                     51, 52, 53, 54, 55, 56, 57, 58]]
EOS = 2


@pytest.mark.parametrize("width,length_penalty", [(2, 1.0), (3, 0.6)])
def test_matches_hf_beam_search(tiny_llm, hf_tiny, width, length_penalty):
    steps = 5
    ours = tiny_llm.beam_search(
        [{"prompt_token_ids": p} for p in PROMPTS],
        BeamSearchParams(beam_width=width, max_tokens=steps,
                         length_penalty=length_penalty))
    for prompt, out in zip(PROMPTS, ours):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            hf = hf_tiny.generate(
                ids, attention_mask=torch.ones_like(ids), num_beams=width,
                num_return_sequences=width, max_new_tokens=steps,
                length_penalty=length_penalty, do_sample=False,
                output_scores=True, return_dict_in_generate=True,
                pad_token_id=EOS)
        hf_seqs = [s.tolist() for s in hf.sequences]
        # (No beam met EOS here, so both run max_tokens steps.)
        assert all(EOS not in s[len(prompt):] for s in hf_seqs)
        assert [s.tokens for s in out.sequences] == hf_seqs
        # HF's score divides by the generated length; vLLM's by the whole.
        for seq, hf_score in zip(out.sequences, hf.sequences_scores.tolist()):
            assert abs(seq.cum_logprob / steps ** length_penalty - hf_score) < 1e-4
            assert len(seq.logprobs) == steps and seq.finish_reason == "length"
            assert isinstance(seq.text, str)


def test_score_and_params():
    assert get_beam_search_score([5, 6, 2], -4.0, {2}, 1.0) == -2.0
    assert get_beam_search_score([5, 6, 7, 8], -4.0, {2}, 0.5) == -2.0
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=3)
    with pytest.raises(ValueError, match="max_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=0)


def test_eos_only_ends_a_beam(tiny_llm):
    """EOS only ever ends a beam, and such a beam says "stop"."""
    out = tiny_llm.beam_search([[1, 2]], BeamSearchParams(beam_width=2,
                                                          max_tokens=3))
    seqs = out[0].sequences
    assert 1 <= len(seqs) <= 2
    for s in seqs:
        gen = s.tokens[2:]
        assert EOS not in gen[:-1]  # EOS can only end a beam
        assert (s.finish_reason == "stop") == (gen[-1] == EOS)
