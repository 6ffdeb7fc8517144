"""Which engine the arguments describe, and the bring-up of several
processes.

- one replica: `LLMEngine` over this process's devices;
- ``data_parallel_size > 1``: a `DataParallelEngine` front over replicas
  on disjoint devices;
- several processes (``--num-processes`` ...): ``jax.distributed`` first,
  the processes check that they agree on the configuration, then process 0
  builds the engine and every other process runs ``run_worker``;
- ``--distributed-executor-backend ray``: a `RayEngine`, whose Ray actors
  are those processes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import jax

from ..errors import InvalidConfigError
from .parallel_config import ParallelConfig

if TYPE_CHECKING:
    from ..config import EngineArgs
    from ..engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


def initialize(parallel: ParallelConfig) -> None:
    """``jax.distributed.initialize`` from the flags (JAX's environment
    variables and cluster auto-detection fill what is not given); once per
    process, before any device is used."""
    if jax.distributed.is_initialized():
        return
    # Cross-process collectives of the CPU backend (tests, CPU clusters);
    # GPUs use NCCL whatever this says.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(parallel.coordinator, parallel.num_processes,
                                   parallel.process_id)
    except (RuntimeError, ValueError) as e:
        raise InvalidConfigError(
            f"jax.distributed.initialize failed ({e}): check "
            "--distributed-coordinator (process 0's HOST:PORT, reachable from "
            "every process), --num-processes and --process-id, and start "
            "every process before any JAX work in it") from e
    logger.info("process %d of %d: %d local / %d global devices",
                jax.process_index(), jax.process_count(),
                jax.local_device_count(), jax.device_count())


# Whether this process compared its configuration with the others already
# (one multi-process engine per process, as jax.distributed is per process).
_checked = False


def bring_up(args: EngineArgs) -> ParallelConfig:
    """Initializes jax.distributed when the args ask for several processes
    and checks that every process was given the same configuration (once:
    the check is a collective every process joins the same number of
    times)."""
    global _checked
    parallel = args.parallel_config()
    if parallel.multi_process:
        initialize(parallel)
        if not _checked:
            from .agreement import check_same_config
            check_same_config(args)
            _checked = True
    return parallel


def is_worker(args: EngineArgs) -> bool:
    """Whether this process follows process 0's steps (brings JAX up)."""
    parallel = bring_up(args)
    return parallel.multi_process and jax.process_index() != 0


def make_engine(engine_cls: type[LLMEngine], args: EngineArgs) -> Any:
    """The engine the arguments describe: an ``engine_cls``, a
    `DataParallelEngine` over several, or a `RayEngine` (one surface)."""
    parallel = bring_up(args)
    if parallel.backend == "ray":
        from .ray_executor import RayEngine
        return RayEngine(args)
    if parallel.multi_process and jax.process_index() != 0:
        raise InvalidConfigError(
            f"this is process {jax.process_index()} of a multi-process engine: "
            "only process 0 builds the engine and takes requests; run the "
            "others with `jaxinfer serve MODEL ... --process-id N` (or "
            "jaxinfer.distributed.launch.run_worker(args))")
    if parallel.data_parallel_size > 1:
        from ..engine.dp_engine import DataParallelEngine
        return DataParallelEngine(engine_cls, args)
    return engine_cls(args)


def run_worker(args: EngineArgs) -> int:
    """A process other than 0: builds the same runner and runs process 0's
    steps until process 0 stops the engine. Returns the steps run."""
    from ..engine.llm_engine import LLMEngine
    if not is_worker(args):
        raise InvalidConfigError("run_worker runs on processes other than 0 "
                                 "of a multi-process engine")
    engine = LLMEngine(args)  # the same derivation of every size as process 0
    logger.info("process %d follows process 0's steps", jax.process_index())
    return follow_steps(engine)


def follow_steps(engine: LLMEngine) -> int:
    """Runs process 0's steps on ``engine``'s runner (a `DistributedRunner`
    on every process but 0) until process 0 stops; returns the steps run."""
    from .step_broadcast import DistributedRunner
    runner = engine.runner
    if not isinstance(runner, DistributedRunner):
        raise RuntimeError(f"process {jax.process_index()} of "
                           f"{jax.process_count()} built a "
                           f"{type(runner).__name__}, which cannot follow "
                           "process 0's steps")
    return runner.follow()
