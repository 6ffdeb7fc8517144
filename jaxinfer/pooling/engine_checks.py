"""What an engine checks about pooling: whether it is a pooling engine (and
how it pools), and whether a request suits the engine's runner."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequestError
from .config import PoolerConfig, pooler_config
from .params import PoolingParams
from .runner_choice import check_pooling_engine

GENERATE_ON_POOLING = (
    "this engine serves embeddings (runner='pooling'): it cannot generate "
    "text; use LLM.embed / LLM.encode / LLM.score (the server's "
    "/v1/embeddings, /pooling, /score), or start the engine without "
    "runner='pooling' to generate")
POOLING_ON_GENERATE = (
    "this engine generates text: embeddings need an engine started with "
    "runner='pooling' (--runner pooling, or vLLM's --task embed)")


def pooling_engine(args: Any, files: Any, num_processes: int
                   ) -> PoolerConfig | None:
    """The engine's PoolerConfig when ``args`` ask for pooling (the
    settings it refuses are refused here), else None."""
    if args.runner_kind() != "pooling":
        return None
    check_pooling_engine(args, files.config, num_processes)
    return pooler_config(files.source)


def check_runner(pooler: PoolerConfig | None, params: PoolingParams | None,
                 hidden_size: int) -> None:
    """Refuses a generate request on a pooling engine and a pooling one on
    a generating engine, and ``dimensions`` the model cannot give."""
    if pooler is None:
        if params is not None:
            raise InvalidRequestError(POOLING_ON_GENERATE)
        return
    if params is None:
        raise InvalidRequestError(GENERATE_ON_POOLING)
    check_dimensions(pooler, params.dimensions, hidden_size)


def check_dimensions(pooler: PoolerConfig, dimensions: int | None,
                     hidden_size: int) -> None:
    """As vLLM: a cut only for a Matryoshka model (its config.json says
    is_matryoshka or lists matryoshka_dimensions), to at most the hidden
    size, and to one of the listed sizes when there is a list."""
    if dimensions is None:
        return
    allowed = pooler.matryoshka_dimensions
    if allowed is None:
        raise InvalidRequestError(
            f"dimensions={dimensions}: this model does not support Matryoshka "
            "representations (its config.json has no is_matryoshka or "
            "matryoshka_dimensions), so its embeddings cannot be cut: drop "
            "dimensions")
    if dimensions > hidden_size or (allowed and dimensions not in allowed):
        sizes = (", ".join(map(str, allowed)) if allowed
                 else f"1 .. {hidden_size}")
        raise InvalidRequestError(
            f"dimensions={dimensions} is not served by this model: choose "
            f"one of {sizes}")
