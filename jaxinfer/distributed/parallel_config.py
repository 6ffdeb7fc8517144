"""`ParallelConfig`: how one engine is spread over devices and processes.

Built from `EngineArgs` (vLLM's ``--tensor-parallel-size``,
``--pipeline-parallel-size``, ``--data-parallel-size``,
``--distributed-executor-backend`` / ``--worker-use-ray``, and jaxinfer's
``--distributed-coordinator``, ``--num-processes``, ``--process-id``) and
validated here, before any device or weight is touched. What needs the
model or the devices (heads, layers, device counts) is checked by
``check_fits``, still before loading.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..errors import InvalidConfigError

if TYPE_CHECKING:
    from ..config import EngineArgs
    from ..models.config import ModelConfig

BACKENDS = ("uni", "mp", "ray", "external_launcher")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1  # devices one layer is split over ("model")
    pipeline_parallel_size: int = 1  # stages the layers are split into ("stage")
    data_parallel_size: int = 1  # engine replicas on disjoint devices
    # How the processes of one engine start: "uni"/"mp": one process drives
    # every local device (several hosts: one process each, launched by the
    # user with coordinator/num_processes/process_id); "external_launcher":
    # the same, with JAX's cluster auto-detection filling what is not
    # given; "ray": Ray places and supervises the processes.
    backend: str = "uni"
    coordinator: str | None = None  # host:port of process 0's JAX coordinator
    num_processes: int | None = None  # processes of the one JAX program
    process_id: int | None = None  # this process, 0 .. num_processes - 1

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size",
                     "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(
                    f"{name} must be a positive integer, got {value!r}")
        if self.backend not in BACKENDS:
            raise InvalidConfigError(
                f"distributed_executor_backend must be one of "
                f"{', '.join(BACKENDS)}, got {self.backend!r}")
        given = {"distributed_coordinator": self.coordinator,
                 "num_processes": self.num_processes,
                 "process_id": self.process_id}
        named = [k for k, v in given.items() if v is not None]
        if self.backend == "ray" and named:
            raise InvalidConfigError(
                f"{', '.join(named)} given with distributed_executor_backend="
                "'ray': Ray starts the processes and chooses these itself; "
                "drop them")
        if named and self.backend != "external_launcher" and len(named) < 3:
            missing = [k for k in given if k not in named]
            raise InvalidConfigError(
                f"{', '.join(named)} given without {', '.join(missing)}: a "
                "multi-process engine needs all three (or "
                "distributed_executor_backend='external_launcher' to let "
                "JAX detect the cluster)")
        if self.num_processes is not None and self.num_processes < 1:
            raise InvalidConfigError(
                f"num_processes must be >= 1, got {self.num_processes}")
        if self.process_id is not None and (
                self.process_id < 0 or (self.num_processes is not None
                                        and self.process_id >= self.num_processes)):
            raise InvalidConfigError(
                f"process_id must be in 0 .. num_processes - 1 "
                f"({(self.num_processes or 1) - 1}), got {self.process_id}")
        if self.coordinator is not None:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit():
                raise InvalidConfigError(
                    f"distributed_coordinator must be HOST:PORT (process 0's "
                    f"address), got {self.coordinator!r}")
        several = ((self.num_processes or 1) > 1
                   or self.backend in ("external_launcher", "ray"))
        if self.data_parallel_size > 1 and several:
            raise InvalidConfigError(
                f"data_parallel_size={self.data_parallel_size} with several "
                "processes: replicas run in one process over its devices; "
                "across hosts, run one engine (or one multi-process group) "
                "per replica behind a load balancer")

    @property
    def multi_process(self) -> bool:
        """Whether this process joins a JAX program over processes started
        by the user (``jax.distributed``; Ray's workers are the Ray
        executor's business)."""
        return (self.backend == "external_launcher"
                or self.num_processes is not None)

    @property
    def replica_size(self) -> int:
        """Devices one replica takes: tensor x pipeline."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def world_size(self) -> int:
        return self.replica_size * self.data_parallel_size

    def sizes(self) -> str:
        """The sizes that are not 1, as flags, for error messages."""
        parts = [f"{name}={getattr(self, name)}" for name in
                 ("data_parallel_size", "pipeline_parallel_size",
                  "tensor_parallel_size")
                 if getattr(self, name) > 1]
        return " x ".join(parts) or "tensor_parallel_size=1"


def parallel_config_from(args: EngineArgs) -> ParallelConfig:
    """The ParallelConfig of `EngineArgs` (``worker_use_ray`` is vLLM's
    older spelling of ``distributed_executor_backend='ray'``)."""
    backend = args.distributed_executor_backend
    if args.worker_use_ray:
        if backend not in (None, "ray"):
            raise InvalidConfigError(
                f"worker_use_ray asks for the ray backend, but "
                f"distributed_executor_backend={backend!r}: give one of them")
        backend = "ray"
    return ParallelConfig(
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        data_parallel_size=args.data_parallel_size,
        backend=backend or "uni",
        coordinator=args.distributed_coordinator,
        num_processes=args.num_processes, process_id=args.process_id)


def check_fits(parallel: ParallelConfig, model_config: ModelConfig,
               num_devices: int, platform: str, preemption_mode: str,
               num_processes: int = 1, enable_lora: bool = False,
               num_scheduler_steps: int = 1) -> None:
    """What needs the model and the devices, before any weight loads:
    sizes that do not divide heads or layers, more devices than exist (or,
    over several processes, fewer than they hold), features the layout
    cannot serve. ``num_devices``: every process's devices."""
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if model_config.num_heads % tp:
        raise InvalidConfigError(
            f"tensor_parallel_size={tp} must divide the number of attention "
            f"heads ({model_config.num_heads}): pick a divisor of it")
    if model_config.num_layers % pp:
        raise InvalidConfigError(
            f"pipeline_parallel_size={pp} must divide the number of layers "
            f"({model_config.num_layers}): pick a divisor of it")
    if parallel.world_size > num_devices:
        raise InvalidConfigError(
            f"{parallel.sizes()} needs {parallel.world_size} devices, but "
            f"{num_devices} {platform} device(s) are visible: lower the "
            "sizes (or add processes/hosts)")
    if num_processes > 1 and parallel.world_size != num_devices:
        raise InvalidConfigError(
            f"{parallel.sizes()} uses {parallel.world_size} of the "
            f"{num_devices} devices of {num_processes} processes: one "
            "program spans every process, so tensor x pipeline parallel "
            "sizes must multiply to the device count")
    several = (num_processes > 1 or parallel.multi_process
               or parallel.backend == "ray")
    if preemption_mode == "swap" and (pp > 1 or several):
        raise InvalidConfigError(
            "preemption_mode='swap' (or swap_space) with pipeline stages or "
            "several processes: swapped pages are copied through one "
            "process's host memory; use preemption_mode='recompute'")
    # Process 0 alone fills adapter slots and encodes images; the others
    # would run their steps against stale slots and an empty encoder cache.
    if enable_lora and several:
        raise InvalidConfigError(
            "enable_lora with several processes is not supported yet: serve "
            "LoRA adapters from one process (tensor parallelism within one "
            "host works)")
    if num_scheduler_steps > 1 and several:  # the others replay one step each
        raise InvalidConfigError(
            f"num_scheduler_steps={num_scheduler_steps} with several processes "
            "is not supported yet: the step broadcast carries single steps; "
            "use num_scheduler_steps=1 (or one process)")
    if model_config.image_input is not None and several:
        raise InvalidConfigError(
            "a multimodal model over several processes is not supported "
            "yet: images are encoded on process 0 only; serve it from one "
            "process")
