"""Every request is checked and tokenized here, completely, before it reaches
the engine loop: `LLM.generate`, the OpenAI server and `/generate` all go
through `InputProcessor.process` (the servers call it from a worker thread,
so a large prompt never blocks the event loop).

Whatever a client can send fails here with an `InvalidRequestError` that says
what to change: wrong types (token ids given as floats, strings or bools),
text that is not valid Unicode (lone surrogates), ids outside the
vocabulary, prompts too long for the context, and sampling parameters the
model cannot serve. The engine loop then only meets requests it can run.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError
from ..lora.errors import LoRANotEnabledError
from ..lora.request import LoRARequest
from ..pooling.params import PoolingParams
from ..sampling_params import RequestOutputKind, SamplingParams
from ..structured.grammar import GrammarCompiler

if TYPE_CHECKING:  # adapters live in the engine; a front end never loads one
    from ..lora.peft_format import LoRAAdapter
    from ..lora.store import AdapterStore


@dataclasses.dataclass(frozen=True)
class ProcessedInput:
    """A request ready for the scheduler: nothing about it can fail later."""
    prompt: str | None  # the prompt text, when one was given
    prompt_token_ids: list[int]  # in [0, vocab_size), 1 <= len < max_model_len
    params: SamplingParams  # verified for the model, bad_words tokenized
    # Images, preprocessed, each over its (expanded) placeholder tokens in
    # prompt_token_ids; in prompt order.
    mm_inputs: tuple = ()
    lora: LoRAAdapter | None = None  # its LoRA adapter, read and checked
    # A pooling request (its prompt is prefilled and pooled, nothing is
    # sampled; ``params`` then only carries truncation); None: generate.
    pooling: PoolingParams | None = None


def check_text(field: str, value: Any) -> str:
    """``value`` as a string that encodes to UTF-8 (no lone surrogates, which
    tokenizers and JSON encoders refuse)."""
    if not isinstance(value, str):
        raise InvalidRequestError(
            f"{field} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{field} is not valid Unicode: it holds a lone surrogate "
            f"{value[e.start:e.end]!r} at position {e.start}; send UTF-8 text") from None
    return value


def check_token_ids(field: str, ids: Any, vocab_size: int) -> list[int]:
    """``ids`` as a list of ints in [0, vocab_size); bools, floats and
    strings are refused rather than converted."""
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):
        ids = ids.tolist()  # a numpy array
    if not isinstance(ids, (list, tuple)):
        raise InvalidRequestError(
            f"{field} must be a list of token ids, got {type(ids).__name__}")
    wrong = [t for t in ids
             if not isinstance(t, numbers.Integral) or isinstance(t, bool)]
    if wrong:
        raise InvalidRequestError(
            f"{field} must hold integer token ids, got {repr(wrong[0])[:40]} "
            f"({type(wrong[0]).__name__})")
    ids = [int(t) for t in ids]
    outside = [t for t in ids if not 0 <= t < vocab_size]
    if outside:
        raise InvalidRequestError(
            f"{field} holds token ids {outside[:5]} outside the vocabulary "
            f"[0, {vocab_size})")
    return ids


def check_context_length(prompt_len: int, max_tokens: int | None,
                         max_model_len: int) -> None:
    """A server request must fit the context whole (as OpenAI and vLLM's
    servers refuse it), naming what to shorten."""
    if prompt_len >= max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. "
            f"However, your prompt has {prompt_len} tokens: shorten it to at "
            f"most {max_model_len - 1} tokens.")
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. "
            f"However, you requested {prompt_len + max_tokens} tokens "
            f"({prompt_len} in the prompt, {max_tokens} for the completion). "
            f"Reduce the prompt or max_tokens.")


def check_widths(params: SamplingParams, vocab_size: int) -> None:
    """Per-token lists are capped at the vocabulary (one entry per token):
    the step pads them to widths fixed at start (worker/sampler_widths.py),
    so a longer list could not be served without a new program."""
    for field, value in (("allowed_token_ids", params.allowed_token_ids),
                         ("logit_bias", params.logit_bias)):
        if value is not None and len(value) > vocab_size:
            raise InvalidRequestError(
                f"{field} holds {len(value)} entries; at most {vocab_size} "
                f"(the vocabulary size) are served: drop the repeated ids")


class InputProcessor:
    """Checks and tokenizes requests for one served model."""

    def __init__(self, tokenizer, *, vocab_size: int, max_model_len: int,
                 max_logprobs: int, max_num_seqs: int, images=None,
                 architecture: str = "the model",
                 lora_store: AdapterStore | None = None,
                 grammars: GrammarCompiler | None = None):
        self.tokenizer = tokenizer
        # Compiles structured-output constraints (cached per spec); None:
        # the engine refuses them.
        self.grammars = grammars
        self.lora_store = lora_store  # None: the engine runs without LoRA
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.max_num_seqs = max_num_seqs
        # jaxinfer.multimodal.processor.ImageProcessor; None: text only.
        self.images = images
        if images is not None:
            images.max_model_len = max_model_len
        self.architecture = architecture

    def check_takes_images(self, what: str) -> None:
        """Raises for a text-only model, naming what carried the image."""
        if self.images is None:
            raise InvalidRequestError(
                f"{what} needs a multimodal model: {self.architecture} takes "
                "text only")

    def encode(self, field: str, text: Any, add_special_tokens: bool = True) -> list[int]:
        """Tokenizes text; anything the tokenizer refuses is bad input."""
        check_text(field, text)
        try:
            return list(self.tokenizer.encode(
                text, add_special_tokens=add_special_tokens))
        except Exception as e:  # noqa: BLE001 - the text was the problem
            raise InvalidRequestError(
                f"{field} could not be tokenized: {e}") from None

    def tokenize_prompt(self, prompt: Any, add_special_tokens: bool = True
                        ) -> tuple[str | None, list[int]]:
        """(text, ids) of any prompt form `LLM.generate` accepts: a string,
        a list of token ids, or a dict with ``prompt`` or ``prompt_token_ids``."""
        if isinstance(prompt, dict):
            if "multi_modal_data" in prompt:
                raise InvalidRequestError(
                    "multi_modal_data (images) cannot go through beam search: "
                    "run the request without use_beam_search")
            unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
            if unknown:
                raise InvalidRequestError(
                    f"a prompt dict takes 'prompt' and 'prompt_token_ids', got "
                    f"{', '.join(map(repr, unknown))}")
            if "prompt_token_ids" in prompt:
                text = prompt.get("prompt")
                if text is not None:
                    check_text("prompt", text)
                return text, check_token_ids(
                    "prompt_token_ids", prompt["prompt_token_ids"], self.vocab_size)
            if "prompt" not in prompt:
                raise InvalidRequestError(
                    "a prompt dict needs 'prompt' or 'prompt_token_ids'")
            prompt = prompt["prompt"]
            if not isinstance(prompt, str):
                raise InvalidRequestError(
                    f"'prompt' in a prompt dict must be a string, got "
                    f"{type(prompt).__name__}")
        if isinstance(prompt, str):
            return prompt, self.encode("prompt", prompt, add_special_tokens)
        if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):
            return None, check_token_ids("prompt", prompt, self.vocab_size)
        raise InvalidRequestError(
            f"a prompt must be a string, a list of token ids or a dict, got "
            f"{type(prompt).__name__}")

    def check_params(self, params: Any) -> SamplingParams:
        """A verified copy of ``params`` with its bad_words tokenized."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(
                f"sampling params must be a SamplingParams, got "
                f"{type(params).__name__}")
        if params.num_samples > self.max_num_seqs:
            field = "best_of" if params.num_samples > params.n else "n"
            raise InvalidRequestError(
                f"{field} must be <= max_num_seqs ({self.max_num_seqs}), got "
                f"{params.num_samples}")
        try:
            params.verify_for_model(self.vocab_size, self.max_logprobs)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        check_widths(params, self.vocab_size)
        for i, s in enumerate(params.stop or ()):
            check_text(f"stop[{i}]", s)
        for i, w in enumerate(params.bad_words or ()):
            check_text(f"bad_words[{i}]", w)
        params = params.clone()
        try:
            params.update_from_tokenizer(self.tokenizer)
        except Exception as e:  # noqa: BLE001 - a word the tokenizer refuses
            raise InvalidRequestError(
                f"bad_words could not be tokenized: {e}") from None
        if params.structured_outputs is not None:
            if self.grammars is None:
                raise InvalidRequestError(
                    "structured outputs need the engine's grammar compiler; "
                    "this input processor has none")
            # Compiled (or found in the cache) here, on the caller's thread:
            # a schema the library refuses fails before the request queues.
            params.set_compiled_grammar(
                self.grammars.compile(params.structured_outputs))
        return params

    def load_lora(self, lora_request: Any) -> LoRAAdapter | None:
        """The request's adapter, read from disk unless cached (this is
        where a server reads adapters: on a worker thread)."""
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise InvalidRequestError(
                f"lora_request must be a LoRARequest (from "
                f"jaxinfer.lora.request), got {type(lora_request).__name__}")
        if self.lora_store is None:
            raise LoRANotEnabledError(
                f"lora_request {lora_request.lora_name!r} was given, but the "
                "engine runs without LoRA: start it with enable_lora=True "
                "(--enable-lora)")
        return self.lora_store.load(lora_request)

    def process(self, prompt: Any, params: SamplingParams | None = None,
                add_special_tokens: bool = True,
                lora_request: LoRARequest | None = None) -> ProcessedInput:
        """The whole check of one request; raises InvalidRequestError."""
        mm_data = None
        if isinstance(prompt, dict) and "multi_modal_data" in prompt:
            prompt = dict(prompt)
            mm_data = prompt.pop("multi_modal_data")
            if mm_data is not None:
                self.check_takes_images("multi_modal_data")
        text, ids = self.tokenize_prompt(prompt, add_special_tokens)
        if params is not None and getattr(params, "use_beam_search", False):
            raise InvalidRequestError(
                "use_beam_search=True runs as a beam search (LLM.generate, "
                "LLM.beam_search or the server), not as one engine request")
        truncate = getattr(params, "truncate_prompt_tokens", None)
        if truncate is not None:
            if mm_data:
                raise InvalidRequestError(
                    "truncate_prompt_tokens cannot be combined with images "
                    "(it could cut an image's placeholders): drop one")
            ids = ids[-truncate:]  # vLLM: keep the last k tokens
        if not ids:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        mm_inputs: tuple = ()
        if self.images is not None:
            ids, mm_inputs = self.images.process(ids, mm_data)
        if len(ids) >= self.max_model_len:
            images = (f" ({sum(m.length for m in mm_inputs)} of them for "
                      f"{len(mm_inputs)} image(s))" if mm_inputs else "")
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens{images}, but max_model_len "
                f"is {self.max_model_len}: shorten the prompt to at most "
                f"{self.max_model_len - 1} tokens or raise max_model_len")
        return ProcessedInput(text, ids, self.check_params(params), mm_inputs,
                              self.load_lora(lora_request))

    def process_pooling(self, prompt: Any, params: PoolingParams | None = None,
                        add_special_tokens: bool = True) -> ProcessedInput:
        """The whole check of one pooling request (text or token ids only);
        raises InvalidRequestError. The prompt may fill the context: no
        token follows it."""
        if params is None:
            params = PoolingParams()
        if not isinstance(params, PoolingParams):
            raise InvalidRequestError(
                f"pooling params must be a PoolingParams, got "
                f"{type(params).__name__}")
        if isinstance(prompt, dict) and "multi_modal_data" in prompt:
            raise InvalidRequestError(
                "multi_modal_data: a pooling model embeds text only")
        text, ids = self.tokenize_prompt(prompt, add_special_tokens)
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]  # vLLM: the last k
        if not ids:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        if len(ids) > self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens, but max_model_len is "
                f"{self.max_model_len}: shorten it (or set "
                "truncate_prompt_tokens) or raise max_model_len")
        # Internal: a prefill with nothing to sample or detokenize.
        prefill = SamplingParams(max_tokens=1, detokenize=False,
                                 output_kind=RequestOutputKind.FINAL_ONLY)
        return ProcessedInput(text, ids, prefill, pooling=params.clone())
