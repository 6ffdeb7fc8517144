"""`EngineWorker`: one process of a Ray engine (a Ray actor; `RayEngine`
in ``ray_executor.py`` makes the class remote and drives it). Worker 0 runs
the `LLMEngine`; the others follow its steps, as processes launched by hand
would (``step_broadcast.py``)."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import EngineArgs
    from ..engine.llm_engine import EngineStats, LLMEngine
    from ..outputs import RequestOutput


class EngineWorker:
    """One process of the engine (a Ray actor; `RayEngine` makes the class
    remote). Worker 0 runs the engine; the others follow its steps."""

    def __init__(self) -> None:
        self.engine: LLMEngine | None = None
        self._done = threading.Event()

    def _started(self) -> LLMEngine:
        if self.engine is None:
            raise RuntimeError("EngineWorker.start has not built the engine")
        return self.engine

    def coordinator_address(self) -> str:
        """This node's address and a free port for the JAX coordinator."""
        import ray
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def start(self, args: EngineArgs, coordinator: str, num_processes: int,
              process_id: int) -> dict:
        from ..engine.llm_engine import LLMEngine
        from .launch import bring_up
        args = dataclasses.replace(
            args, distributed_executor_backend=None, worker_use_ray=False,
            distributed_coordinator=coordinator if num_processes > 1 else None,
            num_processes=num_processes if num_processes > 1 else None,
            process_id=process_id if num_processes > 1 else None)
        bring_up(args)
        self.engine = LLMEngine(args)
        e = self.engine
        return {"scheduler_config": e.scheduler_config,
                "cache_config": e.cache_config,
                "num_blocks": e.runner.num_blocks,
                "kv_cache_dtype": str(e.runner.kv_pages[0][0].dtype),
                "max_logprobs": e.max_logprobs,
                "eos_token_ids": e.eos_token_ids,
                "warmup": (e.warmup_programs, e.warmup_seconds),
                "pid": os.getpid()}

    def follow(self) -> int:
        try:
            from .launch import follow_steps
            return follow_steps(self._started())
        finally:
            self._done.set()

    def add_request(self, request_id: str | None, prompt: Any,
                    arrival_time: float | None, priority: int) -> str:
        return self._started().add_request(request_id, prompt,
                                           arrival_time=arrival_time,
                                           priority=priority)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        self._started().abort_request(request_ids)

    def step(self) -> tuple[list[RequestOutput], bool, EngineStats]:
        engine = self._started()
        outputs = engine.step()
        return (outputs, engine.has_unfinished_requests(), engine.get_stats())

    def reset_prefix_cache(self) -> None:
        self._started().reset_prefix_cache()

    def stats(self) -> EngineStats:
        return self._started().get_stats()

    def shutdown(self) -> None:
        stop = getattr(self._started().runner, "shutdown", None)
        if stop is not None:
            stop()
        self._done.set()

    def lifetime(self) -> None:
        """Returns when the worker is done; fails when its process dies
        (in a concurrency group of its own, beside the engine calls)."""
        self._done.wait()
