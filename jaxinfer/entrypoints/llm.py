"""`LLM`: vLLM's offline API (`generate`, `chat`) over an `LLMEngine`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import EngineArgs
from ..engine.llm_engine import LLMEngine
from ..fast_tokenizer import hf_tokenizer
from ..lora.request import LoRARequest, per_prompt
from ..outputs import (
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from ..pooling.params import PoolingParams
from ..sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """An offline engine. ``LLM()`` runs the embedded SmolLM2-135M-Instruct.

    Keyword arguments are vLLM's engine arguments (see ``EngineArgs``):
    ``model``, ``dtype``, ``max_model_len``, ``block_size``,
    ``gpu_memory_utilization``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``enable_prefix_caching``, ``swap_space``, ``seed``, ...
    """

    def __init__(self, model: str = "smollm2-135m-instruct", **kwargs: Any):
        from ..compat.surface import split_engine_kwargs
        # vLLM arguments jaxinfer lacks are refused or ignored by name.
        kwargs = split_engine_kwargs(kwargs, set(EngineArgs.__dataclass_fields__))
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLM:
        llm = cls.__new__(cls)
        llm.llm_engine = LLMEngine.from_engine_args(args)
        return llm

    def get_tokenizer(self):
        """transformers' tokenizer, as vLLM's (the engine may serve a cached
        GGUF tokenizer without it: fast_tokenizer.py)."""
        return hf_tokenizer(self.llm_engine.tokenizer)

    def generate(self, prompts,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Runs every prompt to completion; outputs come back in input order.

        ``prompts``: a string, a list of strings, a list of token-id lists, or
        ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}`` dicts; a dict may
        carry ``"multi_modal_data": {"image": PIL.Image | [PIL.Image, ...]}``
        for a model that takes images (one ``<image>`` placeholder per
        image in the prompt).
        ``lora_request``: one `LoRARequest` for every prompt, or a list with
        one per prompt (None: the base model); needs ``enable_lora=True``.
        """
        if isinstance(prompts, (str, dict)) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for "
                                 f"{len(prompts)} prompts")
        loras = per_prompt(lora_request, len(prompts))
        if any(sp.use_beam_search for sp in params):
            return self._generate_mixed(prompts, params, use_tqdm, priority,
                                        loras)
        # Offline runs only read final outputs: like vLLM, ask for nothing
        # else, so no per-step RequestOutput copies the growing token lists.
        params = [_final_only(sp) for sp in params]
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for "
                             f"{len(prompts)} prompts")
        engine = self.llm_engine
        # Atomic: every prompt is checked before any is queued, and whatever
        # goes wrong while queueing removes the ones already added, so a bad
        # prompt never leaves others to run inside the next call.
        processed = [engine.input_processor.process(prompt, sp,
                                                    lora_request=lora)
                     for prompt, sp, lora in zip(prompts, params, loras)]
        ids: list[str] = []
        try:
            for i, request in enumerate(processed):
                ids.append(engine.add_request(
                    None, request,
                    priority=priority[i] if priority is not None else 0))
        except BaseException:
            engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    def _generate_mixed(self, prompts, params, use_tqdm, priority, loras):
        """Prompts whose params ask for use_beam_search run as beam
        searches, the rest as usual; outputs stay in input order."""
        from .beam_search import beam_search_as_outputs
        beam = [i for i, sp in enumerate(params) if sp.use_beam_search]
        rest = [i for i, sp in enumerate(params) if not sp.use_beam_search]
        if priority is not None and any(priority[i] for i in beam):
            raise ValueError("priority is not supported with use_beam_search")
        out: dict[int, RequestOutput] = {}
        if rest:
            got = self.generate([prompts[i] for i in rest],
                                [params[i] for i in rest], use_tqdm=use_tqdm,
                                lora_request=[loras[i] for i in rest],
                                priority=None if priority is None else
                                [priority[i] for i in rest])
            out.update(zip(rest, got))
        for i in beam:
            out[i] = beam_search_as_outputs(self, [prompts[i]], params[i],
                                            [f"beam-{i}"], loras[i])[0]
        return [out[i] for i in range(len(prompts))]

    def beam_search(self, prompts, params, lora_request=None,
                    use_tqdm: bool = False):
        """vLLM's beam search: ``params`` is a ``BeamSearchParams``; returns
        one ``BeamSearchOutput`` (best sequences first) per prompt.
        ``lora_request``: one adapter for all prompts or one per prompt."""
        from .beam_search import beam_search
        return beam_search(self, prompts, params, use_tqdm, lora_request)

    def chat(self, messages, sampling_params: SamplingParams | None = None,
             use_tqdm: bool = True,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             chat_template: str | None = None,
             add_generation_prompt: bool = True,
             chat_template_content_format: str = "auto") -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of
        them, rendered through the tokenizer's chat template; ``lora_request``
        as in `generate`. Content may be a list of parts: text, and for a
        model that takes images ``{"type": "image_url", "image_url": {"url":
        "data:image/...;base64,..."}}`` or ``{"type": "image_pil",
        "image_pil": PIL.Image}``."""
        from ..multimodal.chat import detect_content_format, parse_chat_messages
        if messages and isinstance(messages[0], dict):
            messages = [messages]
        engine = self.llm_engine
        tok, inputs = engine.tokenizer, engine.input_processor
        fmt = chat_template_content_format
        if fmt == "auto":
            fmt = detect_content_format(chat_template or getattr(
                tok, "chat_template", None))
        prompts = []
        for conv in messages:
            conv, images = parse_chat_messages(
                conv, content_format=fmt,
                placeholder=inputs.images.placeholder if inputs.images else "",
                allowed_local_media_path=engine.args.allowed_local_media_path,
                on_first_image=lambda: inputs.check_takes_images(
                    "an image content part"),
                check_count=inputs.images.check_count if inputs.images else None)
            prompt: dict = {"prompt_token_ids": _as_ids(tok.apply_chat_template(
                conv, chat_template=chat_template, tokenize=True,
                add_generation_prompt=add_generation_prompt))}
            if images:
                prompt["multi_modal_data"] = {"image": images}
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm,
                             lora_request=lora_request)

    # -- pooling models (runner="pooling"; entrypoints/llm_pooling.py) ------

    def encode(self, prompts, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
               use_tqdm: bool = True, lora_request: LoRARequest | None = None,
               pooling_task: str | None = None,
               truncate_prompt_tokens: int | None = None
               ) -> list[PoolingRequestOutput]:
        """Pools each prompt (prompts as in `generate`): a
        `PoolingRequestOutput` whose ``outputs.data`` is the pooled vector,
        finished as ``pooling_params`` say (normalized unless
        ``normalize=False``)."""
        from . import llm_pooling
        return llm_pooling.run_pooling(
            self, prompts, pooling_params, pooling_task or "encode", use_tqdm,
            lora_request, truncate_prompt_tokens)

    def embed(self, prompts, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              use_tqdm: bool = True, lora_request: LoRARequest | None = None,
              truncate_prompt_tokens: int | None = None
              ) -> list[EmbeddingRequestOutput]:
        """One `EmbeddingRequestOutput` per prompt (``outputs.embedding``:
        a list of floats)."""
        from . import llm_pooling
        return llm_pooling.embed(self, prompts, pooling_params, use_tqdm,
                                 lora_request, truncate_prompt_tokens)

    def score(self, data_1, data_2, truncate_prompt_tokens: int | None = None,
              use_tqdm: bool = True,
              pooling_params: PoolingParams | None = None,
              lora_request: LoRARequest | None = None
              ) -> list[ScoringRequestOutput]:
        """The cosine similarity of the embeddings of each pair: one text
        against each of ``data_2``, or two lists pairwise."""
        from . import llm_pooling
        return llm_pooling.score(self, data_1, data_2, pooling_params,
                                 use_tqdm, lora_request, truncate_prompt_tokens)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        wanted = set(ids)
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True)
        n_in = n_out = 0
        try:
            while engine.has_unfinished_requests() and len(final) < len(ids):
                for out in engine.step():
                    if out.finished and out.request_id in wanted:
                        final[out.request_id] = out
                        if bar is not None:
                            n_in += len(out.prompt_token_ids)
                            n_out += sum(len(c.token_ids) for c in out.outputs)
                            rate = bar.format_dict["elapsed"] or 1e-9
                            bar.set_postfix_str(f"input: {n_in / rate:.1f} tok/s, "
                                                f"output: {n_out / rate:.1f} tok/s")
                            bar.update(1)
        except BaseException:  # interrupted: leave nothing for the next call
            engine.abort_request([i for i in ids if i not in final])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [final[i] for i in ids]


def _as_ids(rendered) -> list[int]:
    # transformers 5 returns a BatchEncoding-like mapping; 4.x a list.
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    return list(rendered)


def _final_only(sp: SamplingParams) -> SamplingParams:
    sp = sp.clone()
    sp.output_kind = RequestOutputKind.FINAL_ONLY
    return sp
