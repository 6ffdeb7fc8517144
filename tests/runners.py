"""Engine-vs-Hugging-Face harness (STYLE.md item 11).

``HfRunner`` (torch, float32) and ``JaxInferRunner`` share one API:

    generate_greedy(prompts, max_tokens) -> [(token_ids, text)]
    generate_greedy_logprobs(prompts, max_tokens, num_logprobs)
        -> [(token_ids, text, [{token_id: logprob}] one dict per new token)]
    prefill_logits(prompts) -> [np.ndarray [T_i, V] float32]

``token_ids`` and ``text`` are the generated continuation only (EOS included
in the ids when hit, special tokens skipped in the text). Both runners stop at
EOS or after ``max_tokens``. Prompts are strings or token-id lists.

``check_outputs_equal`` wants exact tokens and text; ``check_logprobs_close``
lets two greedy sequences diverge only at a near-tie: where they first differ,
each side's token must be among the other's top-k, and the comparison of that
sequence stops there (after a divergence the contexts differ).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

GreedyOutput = tuple[list[int], str]
LogprobsOutput = tuple[list[int], str, list[dict[int, float]]]


def _top_logprobs(logits_row, chosen: int, k: int) -> dict[int, float]:
    """{token: logprob} for the k most likely tokens plus the chosen one."""
    import torch
    lp = torch.log_softmax(logits_row.float(), dim=-1)
    top = torch.topk(lp, k).indices.tolist() if k > 0 else []
    return {int(t): float(lp[t]) for t in {*top, int(chosen)}}


class HfRunner:
    """HF transformers reference: ``AutoModelForCausalLM.from_pretrained``
    in float32, one ``generate(do_sample=False)`` per prompt (batched
    generation pads, and padding changes float rounding)."""

    def __init__(self, model_path_or_gguf: str, dtype: str = "float32",
                 tokenizer=None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
        self.torch = torch
        # One intra-op thread: on a small shared CPU, torch's spinning
        # worker threads make tiny-model generation ~20x slower.
        torch.set_num_threads(1)
        kwargs: dict = {"local_files_only": True}
        path = model_path_or_gguf
        if path.endswith(".gguf"):
            path, kwargs["gguf_file"] = os.path.split(os.path.abspath(path))
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # GGUF conversion prints progress
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype), **kwargs).eval()
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(
                path, **kwargs)
        finally:
            hf_logging.set_verbosity(verbosity)
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else (
            self.tokenizer.eos_token_id)
        self.eos_token_id = eos
        self.pad_token_id = gc.pad_token_id if gc.pad_token_id is not None else (
            eos[0] if isinstance(eos, list) else eos)

    def encode(self, prompt) -> list[int]:
        return list(prompt) if not isinstance(prompt, str) else (
            self.tokenizer.encode(prompt))

    def _generate(self, prompt, max_tokens: int):
        torch = self.torch
        ids = torch.tensor([self.encode(prompt)])
        with torch.no_grad():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=max_tokens, min_new_tokens=0,
                eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                output_logits=True, return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:].tolist()
        # Generation stops at EOS; nothing after it is padding here (one
        # sequence), but cut defensively at the first EOS.
        eos = self.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for i, t in enumerate(new):
            if t in eos:
                new = new[:i + 1]
                break
        return new, [lg[0] for lg in out.logits[:len(new)]]

    def _text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate_greedy(self, prompts: Sequence, max_tokens: int
                        ) -> list[GreedyOutput]:
        outs = []
        for p in prompts:
            ids, _ = self._generate(p, max_tokens)
            outs.append((ids, self._text(ids)))
        return outs

    def generate_greedy_logprobs(self, prompts: Sequence, max_tokens: int,
                                 num_logprobs: int) -> list[LogprobsOutput]:
        outs = []
        for p in prompts:
            ids, logits = self._generate(p, max_tokens)
            lps = [_top_logprobs(row, t, num_logprobs)
                   for row, t in zip(logits, ids)]
            outs.append((ids, self._text(ids), lps))
        return outs

    def prefill_logits(self, prompts: Sequence) -> list[np.ndarray]:
        torch = self.torch
        outs = []
        for p in prompts:
            ids = torch.tensor([self.encode(p)])
            with torch.no_grad():
                logits = self.model(ids).logits[0]
            outs.append(logits.float().numpy())
        return outs


class JaxInferRunner:
    """The engine under test, through vLLM's offline API (``LLM``)."""

    def __init__(self, model: str, **engine_kwargs):
        from jaxinfer import LLM
        engine_kwargs.setdefault("dtype", "float32")
        self.llm = LLM(model=model, **engine_kwargs)
        self.engine = self.llm.llm_engine
        self.tokenizer = self.llm.get_tokenizer()

    @staticmethod
    def _as_input(prompt):
        return prompt if isinstance(prompt, str) else {
            "prompt_token_ids": list(prompt)}

    def _generate(self, prompts, **sampling):
        from jaxinfer import SamplingParams
        sp = SamplingParams(temperature=0.0, **sampling)
        return self.llm.generate([self._as_input(p) for p in prompts], sp,
                                 use_tqdm=False)

    def generate_greedy(self, prompts: Sequence, max_tokens: int
                        ) -> list[GreedyOutput]:
        outs = self._generate(prompts, max_tokens=max_tokens)
        return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]

    def generate_greedy_logprobs(self, prompts: Sequence, max_tokens: int,
                                 num_logprobs: int) -> list[LogprobsOutput]:
        outs = self._generate(prompts, max_tokens=max_tokens,
                              logprobs=num_logprobs)
        result = []
        for o in outs:
            c = o.outputs[0]
            if c.logprobs is None:
                raise AssertionError("the engine returned no logprobs for "
                                     "SamplingParams(logprobs=k)")
            lps = [{int(t): float(getattr(lp, "logprob", lp))
                    for t, lp in step.items()} for step in c.logprobs]
            result.append((list(c.token_ids), c.text, lps))
        return result

    def prefill_logits(self, prompts: Sequence) -> list[np.ndarray]:
        """Logits at every prompt position, from one direct call of the
        model forward over all prompts packed as one ragged prefill batch
        (the engine's params, a scratch page pool of its own)."""
        from tests.models.forward import packed_prefill_logits
        runner = self.engine.runner
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p)
               for p in prompts]
        return packed_prefill_logits(runner.model, runner.params,
                                     runner.constants, ids,
                                     block_size=runner.block_size,
                                     dtype=runner.dtype)


def check_outputs_equal(outputs_0: Sequence, outputs_1: Sequence,
                        name_0: str, name_1: str) -> None:
    """Exact equality of every sequence's token ids and text."""
    assert len(outputs_0) == len(outputs_1), (
        f"{name_0} gave {len(outputs_0)} outputs, {name_1} {len(outputs_1)}")
    for i, (o0, o1) in enumerate(zip(outputs_0, outputs_1)):
        ids0, text0 = o0[0], o0[1]
        ids1, text1 = o1[0], o1[1]
        msg = (f"prompt {i}:\n  {name_0}: {text0!r}\n  {name_1}: {text1!r}"
               f"\n  {name_0} ids: {ids0}\n  {name_1} ids: {ids1}")
        assert ids0 == ids1, msg
        assert text0 == text1, msg


def check_logprobs_close(outputs_0: Sequence, outputs_1: Sequence,
                         name_0: str, name_1: str,
                         logprob_atol: float | None = None) -> int:
    """Greedy sequences agree up to their first divergence, and that
    divergence is a near-tie: each side's token is in the other's top-k
    logprobs. Where tokens agree and ``logprob_atol`` is given, the chosen
    token's logprobs must also agree within it. Returns the number of
    sequences that diverged (so a test can bound it)."""
    assert len(outputs_0) == len(outputs_1), (
        f"{name_0} gave {len(outputs_0)} outputs, {name_1} {len(outputs_1)}")
    diverged = 0
    for i, (o0, o1) in enumerate(zip(outputs_0, outputs_1)):
        ids0, text0, lps0 = o0
        ids1, text1, lps1 = o1
        assert len(lps0) == len(ids0) and len(lps1) == len(ids1), (
            f"prompt {i}: one logprobs dict per generated token expected")
        for j, (t0, t1) in enumerate(zip(ids0, ids1)):
            msg = (f"prompt {i}, token {j}: {name_0} chose {t0}, {name_1} "
                   f"chose {t1}\n  {name_0}: {text0!r}\n  {name_1}: {text1!r}"
                   f"\n  {name_0} top: {lps0[j]}\n  {name_1} top: {lps1[j]}")
            if t0 != t1:
                assert t0 in lps1[j], msg
                assert t1 in lps0[j], msg
                diverged += 1
                break
            if logprob_atol is not None:
                assert abs(lps0[j][t0] - lps1[j][t1]) <= logprob_atol, (
                    f"{msg}\n  chosen-token logprobs differ by more than "
                    f"{logprob_atol}")
        else:
            # No divergence: both stopped at the same place with the same text.
            assert ids0 == ids1, (f"prompt {i}: {name_0} {ids0} vs "
                                  f"{name_1} {ids1}")
            assert text0 == text1, (f"prompt {i}: {name_0} {text0!r} vs "
                                    f"{name_1} {text1!r}")
    return diverged
