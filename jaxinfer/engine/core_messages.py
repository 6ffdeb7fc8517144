"""The messages between HTTP front ends and the engine-core process, and
their encoding (msgpack through msgspec; free of JAX).

A front end sends `AddRequest`, `AbortRequests`, `StopSamples` and
`UtilityCall`; the core answers each front end with `CoreOutputs`, one
message per engine step (or per batch of acknowledgements), carrying only
that front end's requests. Prompts travel once, in the `AddRequest`: the
outputs carry each step's new token ids (and logprob ids and values), and
the front end keeps the prompt and makes the text (`frontend_text.py`);
only requests whose params still ask the core to detokenize (best_of > n)
get text from it.

msgspec encodes the dataclasses (`SamplingParams`, `CompletionOutput`,
`LoRARequest`) by their typed fields, so decoding checks every field's
type; images (preprocessed numpy arrays) travel as pickled bytes between
processes of one server.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
from typing import Any

import msgspec

from ..errors import RequestFailedError
from ..logprobs import Logprob
from ..lora.request import LoRARequest
from ..outputs import CompletionOutput, RequestMetrics
from ..pooling.params import PoolingParams
from ..sampling_params import SamplingParams


class AddRequest(msgspec.Struct, tag=True, array_like=True):
    """One request, checked and tokenized by the front end."""
    request_id: str  # unique across front ends (a random id)
    prompt: str | None  # the prompt text, when one was given
    prompt_token_ids: list[int]  # already checked against the vocabulary
    params: SamplingParams  # verified by the front end's InputProcessor
    arrival_time: float  # time.time() when the HTTP request arrived
    priority: int = 0
    lora_request: LoRARequest | None = None  # the core reads the adapter
    mm_inputs: bytes = b""  # pickled tuple of MultiModalInput; b"": none
    # A pooling request (``params`` then only prefill); None: generate.
    pooling_params: PoolingParams | None = None


class AbortRequests(msgspec.Struct, tag=True, array_like=True):
    request_ids: list[str]  # finished or unknown ids are ignored


class StopSamples(msgspec.Struct, tag=True, array_like=True):
    """Samples the front end ended on a stop string (it makes the text):
    the core frees them. The request counts as finished ("stop"), not
    aborted."""
    request_id: str
    # The samples ended while others of the request go on (n > 1); empty:
    # the request is finished for its client.
    indices: list[int] = []


class UtilityCall(msgspec.Struct, tag=True, array_like=True):
    """A call of one of the core's `UTILITY_METHODS`; answered by a
    `UtilityReply` with the same ``call_id``."""
    call_id: int
    method: str
    args: list[Any] = []


FrontendMessage = AddRequest | AbortRequests | StopSamples | UtilityCall

# What a front end may call in the core (anything else is refused there).
UTILITY_METHODS = frozenset({"add_lora", "remove_lora", "list_loras",
                             "served_loras", "cache_state",
                             "render_metrics", "reset_prefix_cache"})


class ErrorInfo(msgspec.Struct, array_like=True):
    """A typed error raised in the core, rebuilt by the front end."""
    type_name: str  # "module:QualName" of a jaxinfer error class
    message: str


class CoreOutput(msgspec.Struct, array_like=True):
    """One request's new outputs of one step (DELTA: new token ids; text
    only where the core detokenizes)."""
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # A pooling request's vector (float32 values; ``outputs`` empty).
    pooled: list[float] | None = None


class RequestError(msgspec.Struct, array_like=True):
    """A request the core refused or failed (it gets no more outputs)."""
    request_id: str
    error: ErrorInfo


class UtilityReply(msgspec.Struct, array_like=True):
    call_id: int
    result: Any = None
    error: ErrorInfo | None = None


class CoreOutputs(msgspec.Struct, array_like=True):
    """Everything the core has for one front end since its last message."""
    outputs: list[CoreOutput] = []
    accepted: list[str] = []  # ids of requests the engine took
    errors: list[RequestError] = []
    replies: list[UtilityReply] = []
    num_waiting: int = 0  # requests not yet running, all front ends'
    dead: ErrorInfo | None = None  # the engine died: every request is lost
    # Every served LoRA adapter (LoRARequest fields), sent to every front
    # end after one was loaded or removed; None: unchanged.
    loras: list[dict[str, Any]] | None = None


def error_info(error: BaseException) -> ErrorInfo:
    cls = type(error)
    return ErrorInfo(f"{cls.__module__}:{cls.__qualname__}", str(error))


def rebuild_error(info: ErrorInfo) -> Exception:
    """The error the core raised, as its own class when that is one of
    jaxinfer's (typed errors keep their HTTP status), else a
    RequestFailedError naming it."""
    module, _, name = info.type_name.partition(":")
    if module.startswith("jaxinfer.") and "." not in name:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            cls = None
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(info.message)
            except TypeError:  # a constructor that takes other arguments
                pass
    return RequestFailedError(f"{info.type_name}: {info.message}")


def pack_mm_inputs(mm_inputs: tuple) -> bytes:
    return pickle.dumps(mm_inputs, protocol=pickle.HIGHEST_PROTOCOL) if mm_inputs else b""


def unpack_mm_inputs(data: bytes) -> tuple:
    return pickle.loads(data) if data else ()


def _enc_hook(obj: Any) -> Any:
    """numpy scalars (a logprob read from a host array) and dataclasses
    nested in `Any` fields."""
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return obj.item()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


class Codec:
    """One encoder and the two decoders (each side decodes one kind)."""

    def __init__(self):
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
        self._frontend = msgspec.msgpack.Decoder(FrontendMessage)
        self._core = msgspec.msgpack.Decoder(CoreOutputs)

    def encode(self, message: Any) -> bytes:
        return self._encoder.encode(message)

    def decode_frontend(self, data: bytes) -> FrontendMessage:
        return self._frontend.decode(data)

    def decode_core(self, data: bytes) -> CoreOutputs:
        return self._core.decode(data)
