"""`--distributed-executor-backend ray` (``--worker-use-ray``): Ray places and
supervises the processes of a multi-process engine; JAX carries the data.

The server's process is the Ray driver and stays outside the JAX program.
It reserves one placement-group bundle per worker (one GPU each by default;
``JAXINFER_RAY_DEVICES_PER_WORKER`` gives each worker more: a whole host,
say) and starts an `EngineWorker` actor in each. The actors call
``jax.distributed.initialize`` with worker 0's address as coordinator;
worker 0 builds the `LLMEngine` (the scheduler, and its share of every
step) and the others follow its steps (``step_broadcast.py``), exactly as
processes launched by hand would.

`RayEngine`, in the driver, offers the `LLMEngine` surface and forwards
requests and steps to worker 0 as actor calls. Every wait on a worker also
watches each worker's lifetime, so a worker that dies (its process killed,
its host lost) turns into `WorkerDiedError` at once: every actor is killed
(the others may be stuck in a collective with the dead one), the engine
loop fails every request, and ``/health`` reports which worker died. The
driver itself never joins a collective, so nothing in it can hang on one.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidConfigError
from ..sampling_params import SamplingParams
from .ray_worker import EngineWorker

if TYPE_CHECKING:
    from ..config import EngineArgs
    from ..engine.input_processor import InputProcessor
    from ..engine.llm_engine import EngineStats
    from ..outputs import RequestOutput

logger = logging.getLogger(__name__)

# Devices (GPUs) each worker process holds; CPU clusters give each worker
# as many host-platform devices.
DEVICES_PER_WORKER_ENV = "JAXINFER_RAY_DEVICES_PER_WORKER"
# How long the cluster may take to find room for the workers.
PLACEMENT_TIMEOUT_S = 120.0
# After a failed step: how long to wait for Ray to report a worker's death
# (the likely cause) before reporting the step's own error.
DEATH_NOTICE_S = 10.0
# Environment variables the workers inherit from the driver.
_PASSED_ENV = ("PYTHONPATH", "JAX_PLATFORMS", "JAX_COMPILATION_CACHE_DIR",
               "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class WorkerDiedError(RuntimeError):
    """A worker process of a Ray engine ended while the engine ran."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise InvalidConfigError(
            "distributed_executor_backend='ray' needs Ray: pip install "
            "'jaxinfer[ray]'") from e
    return ray


class RayEngine:
    """The engine of a Ray cluster, seen from the server's process."""

    def __init__(self, args: EngineArgs) -> None:
        from jaxinfer.models import resolve_model, resolve_tokenizer

        from ..tokenizer import load_tokenizer
        ray = self._ray = _import_ray()
        self.args = args
        parallel = args.parallel_config()
        self.files = resolve_model(args.model, args.load_format)
        self.model_config = self.files.config
        self.tokenizer = load_tokenizer(
            resolve_tokenizer(args.tokenizer) if args.tokenizer
            else self.files.tokenizer)
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"),
                     log_to_driver=False)
        world = parallel.replica_size
        per_worker = int(os.environ.get(DEVICES_PER_WORKER_ENV, "1"))
        if per_worker < 1 or world % per_worker:
            raise InvalidConfigError(
                f"{DEVICES_PER_WORKER_ENV}={per_worker} must divide "
                f"{parallel.sizes()} ({world} devices)")
        self.num_workers = world // per_worker
        gpus = ray.cluster_resources().get("GPU", 0)
        from .parallel_config import check_fits
        check_fits(parallel, self.model_config,
                   int(gpus) if gpus else world, "gpu" if gpus else "cpu",
                   args.resolved_preemption()[0], enable_lora=args.enable_lora,
                   num_scheduler_steps=args.num_scheduler_steps)
        self._closing = False
        self.dead_error: BaseException | None = None
        self._callbacks: list[Callable[[BaseException], None]] = []
        self._place(per_worker, use_gpus=bool(gpus))
        self._start(args)
        self._counter = itertools.count()
        self._unfinished = False
        self._stats: EngineStats | None = None
        self.scheduler = _RemoteQueues(self)
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name="jaxinfer-ray-watch")
        self._watcher.start()

    # -- bring-up -----------------------------------------------------------

    def _place(self, per_worker: int, use_gpus: bool) -> None:
        ray = self._ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        bundle = ({"GPU": per_worker, "CPU": 1} if use_gpus else {"CPU": 1})
        self._pg = placement_group([dict(bundle)] * self.num_workers,
                                   strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self._pg)
            raise InvalidConfigError(
                f"the Ray cluster found no room for {self.num_workers} "
                f"workers of {bundle} in {PLACEMENT_TIMEOUT_S:.0f} s (it "
                f"has {ray.cluster_resources()}): add nodes or lower the "
                "parallel sizes") from None
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        if not use_gpus:  # CPU workers: host-platform devices, gloo collectives
            env["JAX_PLATFORMS"] = "cpu"
            env["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                                f"--xla_force_host_platform_device_count={per_worker}").strip()
        remote = ray.remote(concurrency_groups={"lifetime": 1})(EngineWorker)
        self.workers = [
            remote.options(
                num_cpus=1, num_gpus=per_worker if use_gpus else 0,
                runtime_env={"env_vars": env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=i)).remote()
            for i in range(self.num_workers)]

    def _start(self, args: EngineArgs) -> None:
        self._lifetimes = {w.lifetime.options(concurrency_group="lifetime")
                           .remote(): i for i, w in enumerate(self.workers)}
        coordinator = self._get(self.workers[0].coordinator_address.remote())
        starts = [w.start.remote(args, coordinator, self.num_workers, i)
                  for i, w in enumerate(self.workers)]
        try:
            infos = [self._get(ref) for ref in starts]
        except BaseException:
            self.shutdown()
            raise
        info = infos[0]
        self.worker_pids = [i["pid"] for i in infos]
        # Followers run until worker 0 stops them; their calls stay open.
        for w in self.workers[1:]:
            self._lifetimes[w.follow.remote()] = self.workers.index(w)
        self.scheduler_config = info["scheduler_config"]
        self.cache_config = info["cache_config"]
        self.max_logprobs = info["max_logprobs"]
        self.eos_token_ids = info["eos_token_ids"]
        self.warmup_programs, self.warmup_seconds = info["warmup"]
        self.runner = _RemoteRunner(info["num_blocks"], info["kv_cache_dtype"])
        logger.info("ray engine: %d workers up (pids %s)", self.num_workers,
                    self.worker_pids)

    def describe(self) -> str:
        return (f"ray engine: {self.num_workers} worker processes, pids "
                f"{', '.join(map(str, self.worker_pids))} (worker 0 "
                "schedules; the others follow its steps)")

    # -- supervision -----------------------------------------------------------

    def _get(self, ref: Any) -> Any:
        """``ray.get(ref)``, failing as soon as any worker ends instead."""
        ray = self._ray
        if self.dead_error is not None:
            raise self.dead_error
        ready, _ = ray.wait([ref, *self._lifetimes], num_returns=1)
        ended = [r for r in ready if r in self._lifetimes]
        if ended:
            raise self._died(ended[0])
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise self._died(None, e) from None
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, ValueError):  # a bad request: answered as such
                raise cause from None
            # A collective that failed because a peer died (gloo notices at
            # once) is reported as that worker's death, its root cause.
            ended, _ = ray.wait(list(self._lifetimes), num_returns=1,
                                timeout=DEATH_NOTICE_S)
            if ended:
                raise self._died(ended[0]) from e
            raise

    def _died(self, lifetime_ref: Any, error: BaseException | None = None
              ) -> BaseException:
        """Records a worker's end, kills every worker, tells the callbacks."""
        ray = self._ray
        if self.dead_error is not None:
            return self.dead_error
        index = self._lifetimes.get(lifetime_ref, 0)
        if error is None:
            try:
                ray.get(lifetime_ref)
                error = RuntimeError("it returned while the engine ran")
            except Exception as e:  # noqa: BLE001 - the reason it ended
                error = e
        pids = getattr(self, "worker_pids", None)
        pid = f", pid {pids[index]}" if pids else ""
        self.dead_error = WorkerDiedError(
            f"worker {index} of {self.num_workers} (Ray actor{pid}) died: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}")
        logger.error("%s", self.dead_error)
        self._kill_all()
        for callback in self._callbacks:
            try:
                callback(self.dead_error)
            except Exception:
                logger.exception("engine failure callback failed")
        return self.dead_error

    def _watch(self) -> None:
        """Notices a death while no call is waiting (an idle engine)."""
        ray = self._ray
        ready, _ = ray.wait(list(self._lifetimes), num_returns=1)
        if not self._closing and self.dead_error is None:
            self._died(ready[0])

    def on_failure(self, callback: Callable[[BaseException], None]) -> None:
        """``callback(error)`` runs once if a worker dies (any thread)."""
        self._callbacks.append(callback)

    def _kill_all(self) -> None:
        ray = self._ray
        self._closing = True
        for w in getattr(self, "workers", []):
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            ray.util.remove_placement_group(self._pg)
        except Exception:  # noqa: BLE001 - already removed
            pass

    def shutdown(self) -> None:
        """Stops the workers (worker 0 tells the others first)."""
        if self._closing:
            return
        self._closing = True
        ray = self._ray
        try:
            ray.get(self.workers[0].shutdown.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - killed below anyway
            logger.warning("worker 0 did not stop cleanly; killing the workers")
        self._kill_all()

    # -- the LLMEngine surface ------------------------------------------------

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    @property
    def input_processor(self) -> InputProcessor:
        from ..engine.input_processor import InputProcessor
        if not hasattr(self, "_input_processor"):
            self._input_processor = InputProcessor(
                self.tokenizer, vocab_size=self.model_config.vocab_size,
                max_model_len=self.max_model_len,
                max_logprobs=self.max_logprobs,
                max_num_seqs=self.scheduler_config.max_num_seqs)
        return self._input_processor

    timeline = None

    def add_request(self, request_id: str | None, prompt: Any,
                    params: SamplingParams | None = None,
                    arrival_time: float | None = None,
                    priority: int = 0) -> str:
        from ..engine.input_processor import ProcessedInput
        if not isinstance(prompt, ProcessedInput):
            prompt = self.input_processor.process(prompt, params)
        if request_id is None:
            request_id = f"ray-{next(self._counter)}"
        rid = self._get(self.workers[0].add_request.remote(
            request_id, prompt, arrival_time, priority))
        self._unfinished = True
        return rid

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        if self.dead_error is None:  # calls run in order on worker 0
            self.workers[0].abort_request.remote(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self._unfinished

    def step(self) -> list[RequestOutput]:
        outputs, self._unfinished, self._stats = self._get(
            self.workers[0].step.remote())
        return outputs

    def get_stats(self) -> EngineStats:
        if self._stats is None:
            self._stats = self._get(self.workers[0].stats.remote())
        return self._stats

    def reset_prefix_cache(self) -> None:
        self._get(self.workers[0].reset_prefix_cache.remote())


@dataclasses.dataclass
class _RemoteRunner:
    """What the server reads of the runner, which lives in worker 0."""
    num_blocks: int
    kv_cache_dtype: str
    num_host_blocks: int = 0
    device_seconds: float = 0.0


class _RemoteQueues:
    """Queue lengths as of worker 0's last step (the server's queue limit
    and metrics read these)."""

    def __init__(self, engine: RayEngine):
        self._engine = engine

    @property
    def num_waiting(self) -> int:
        stats = self._engine._stats
        return stats.num_waiting if stats is not None else 0

    @property
    def num_running(self) -> int:
        stats = self._engine._stats
        return stats.num_running if stats is not None else 0
