"""Bad parallel configurations fail at start with a typed error naming what
to change, before any weight loads; vLLM's flags reach the config."""

from __future__ import annotations

import time

import pytest

from jaxinfer.config import EngineArgs
from jaxinfer.distributed.parallel_config import ParallelConfig, check_fits, parallel_config_from
from jaxinfer.entrypoints.cli import build_parser
from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
from jaxinfer.errors import InvalidConfigError


def _serve(*argv):
    return serve_engine_args(build_parser().parse_args(["serve", "m", *argv]))


@pytest.mark.parametrize("argv, field, value", [
    (["-pp", "2"], "pipeline_parallel_size", 2),
    (["--pipeline-parallel-size", "4"], "pipeline_parallel_size", 4),
    (["-dp", "2"], "data_parallel_size", 2),
    (["--distributed-executor-backend", "ray"], "distributed_executor_backend",
     "ray"),
    (["--worker-use-ray"], "worker_use_ray", True),
    (["--distributed-coordinator", "10.0.0.1:1234", "--num-processes", "2",
      "--process-id", "1"], "process_id", 1),
])
def test_parallel_flags_reach_engine_args(argv, field, value):
    assert getattr(_serve(*argv), field) == value


def test_worker_use_ray_is_the_ray_backend():
    assert parallel_config_from(EngineArgs(worker_use_ray=True)).backend == "ray"
    assert parallel_config_from(EngineArgs()).backend == "uni"
    with pytest.raises(InvalidConfigError, match="worker_use_ray .*='mp'"):
        EngineArgs(worker_use_ray=True, distributed_executor_backend="mp")


@pytest.mark.parametrize("kwargs, message", [
    (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be a positive"),
    (dict(data_parallel_size=-1), "data_parallel_size must be a positive"),
    (dict(num_processes=2), "num_processes given without "
     "distributed_coordinator, process_id"),
    (dict(distributed_coordinator="h:1", num_processes=2, process_id=2),
     r"process_id must be in 0 \.\. num_processes - 1 \(1\), got 2"),
    (dict(distributed_coordinator="nohostport", num_processes=2, process_id=0),
     "distributed_coordinator must be HOST:PORT"),
    (dict(distributed_executor_backend="ray", num_processes=2),
     "Ray starts the processes"),
    (dict(data_parallel_size=2, distributed_coordinator="h:1",
          num_processes=2, process_id=0), "data_parallel_size=2 with several"),
    (dict(data_parallel_size=2, distributed_executor_backend="ray"),
     "data_parallel_size=2 with several"),
])
def test_engine_args_refuse_bad_parallel_settings(kwargs, message):
    with pytest.raises(InvalidConfigError, match=message):
        EngineArgs(**kwargs)


class _Model:  # what check_fits reads of a ModelConfig
    num_heads, num_layers = 4, 2
    image_input = None


@pytest.mark.parametrize("sizes, devices, message", [
    (dict(tensor_parallel_size=3), 8,
     r"tensor_parallel_size=3 must divide the number of attention heads \(4\)"),
    (dict(pipeline_parallel_size=4), 8,
     r"pipeline_parallel_size=4 must divide the number of layers \(2\)"),
    (dict(tensor_parallel_size=2, pipeline_parallel_size=2,
          data_parallel_size=2), 4,
     "data_parallel_size=2 x pipeline_parallel_size=2 x tensor_parallel_size=2 "
     "needs 8 devices, but 4 cpu device"),
])
def test_sizes_must_divide_the_model_and_fit_the_devices(sizes, devices,
                                                         message):
    with pytest.raises(InvalidConfigError, match=message):
        check_fits(ParallelConfig(**sizes), _Model(), devices, "cpu",
                   "recompute")


def test_several_processes_must_use_every_device():
    with pytest.raises(InvalidConfigError, match="uses 2 of the 4 devices of 2"):
        check_fits(ParallelConfig(tensor_parallel_size=2), _Model(), 4, "cpu",
                   "recompute", num_processes=2)


def test_lora_and_images_are_refused_over_several_processes():
    """Process 0 alone fills adapter slots and encodes images."""
    with pytest.raises(InvalidConfigError, match="enable_lora with several"):
        check_fits(ParallelConfig(tensor_parallel_size=4), _Model(), 4, "cpu",
                   "recompute", num_processes=2, enable_lora=True)

    class _Llava(_Model):
        image_input = object()
    with pytest.raises(InvalidConfigError, match="multimodal model over several"):
        check_fits(ParallelConfig(backend="ray"), _Llava(), 1, "cpu",
                   "recompute")
    check_fits(ParallelConfig(tensor_parallel_size=4), _Model(), 4, "cpu",
               "recompute", num_processes=2)


def test_multi_step_decode_is_refused_over_several_processes():
    """The step broadcast replays single steps on the other processes."""
    with pytest.raises(InvalidConfigError, match="num_scheduler_steps=4 with several"):
        check_fits(ParallelConfig(tensor_parallel_size=4), _Model(), 4, "cpu",
                   "recompute", num_processes=2, num_scheduler_steps=4)
    check_fits(ParallelConfig(tensor_parallel_size=4), _Model(), 4, "cpu",
               "recompute", num_processes=1, num_scheduler_steps=4)


def test_swap_preemption_is_refused_with_pipeline_stages():
    with pytest.raises(InvalidConfigError, match="preemption_mode='recompute'"):
        check_fits(ParallelConfig(pipeline_parallel_size=2), _Model(), 2,
                   "cpu", "swap")


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_parallel_size=2), "tensor_parallel_size=2 needs 2 devices, "
     "but 1 cpu device"),
    (dict(pipeline_parallel_size=3), "must divide the number of layers"),
    (dict(data_parallel_size=2), "data_parallel_size=2 x tensor_parallel_size=1"
     "|data_parallel_size=2 needs 2 devices"),
])
def test_llm_fails_before_loading_weights(tiny_model_factory, monkeypatch,
                                          kwargs, message):
    """One CPU device in the test process: each error comes from the
    checks, not from a half-built engine."""
    from jaxinfer import LLM
    from jaxinfer.worker import weights
    loaded = []
    monkeypatch.setattr(weights, "load_params",
                        lambda *a, **k: loaded.append(1))
    t0 = time.perf_counter()
    with pytest.raises(InvalidConfigError, match=message):
        LLM(tiny_model_factory(), **kwargs)
    assert not loaded
    assert time.perf_counter() - t0 < 30
