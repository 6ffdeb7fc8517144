"""What the engine-core process tells the server once, at start (free of
JAX: the server's own process and its front ends read it)."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from .engine_client import ServedModel

# The signal that makes an engine-core process write every thread's stack
# to its stderr (the server sends it before killing a core that outlived
# SIGTERM, so the log says where it was).
DUMP_STACKS_SIGNAL = getattr(signal, "SIGUSR1", None)


@dataclasses.dataclass(frozen=True)
class CoreInfo:
    """Everything a front end needs to check and tokenize requests as the
    engine would (sent pickled over a pipe between the server's processes)."""
    model: ServedModel
    model_config: Any  # jaxinfer.models.config.ModelConfig
    model_source: str  # the model's folder (image preprocessor settings)
    tokenizer_source: Any  # jaxinfer.models.tokenizer_source.TokenizerSource
    max_logprobs: int  # -1 resolved
    describe: str | None  # where a multi-process engine's workers run
    warmup_programs: int
    warmup_seconds: float

    @classmethod
    def of(cls, engine) -> CoreInfo:
        describe = getattr(engine, "describe", None)
        tokenizer = (engine.args.tokenizer and _tokenizer_source(engine.args))
        return cls(
            model=ServedModel(
                args=engine.args, vocab_size=engine.model_config.vocab_size,
                max_model_len=engine.max_model_len,
                max_num_seqs=engine.scheduler_config.max_num_seqs,
                eos_token_ids=tuple(engine.eos_token_ids),
                lora_enabled=getattr(engine, "lora_store", None) is not None),
            model_config=engine.model_config, model_source=engine.files.source,
            tokenizer_source=tokenizer or engine.files.tokenizer,
            max_logprobs=engine.max_logprobs,
            describe=describe() if describe is not None else None,
            warmup_programs=engine.warmup_programs,
            warmup_seconds=engine.warmup_seconds)


def _tokenizer_source(args):
    from jaxinfer.models import resolve_tokenizer
    return resolve_tokenizer(args.tokenizer)


def frontend_identity(index: int) -> bytes:
    """Front end ``index``'s ZMQ identity (the core routes outputs by it)."""
    return b"fe%d" % index


def start_error(error: BaseException) -> BaseException:
    """An error of the core's start as the server can unpickle and report
    it: jaxinfer's and Python's own errors as they are, others (from JAX,
    say) as a RuntimeError naming them."""
    module = type(error).__module__
    if module == "builtins" or module.startswith("jaxinfer."):
        return error
    return RuntimeError(f"the engine core failed to start: {error!r}")
