"""Checks of the parallel-layout rows. Equal tokens under each
layout are proved on fake devices and real processes in
tests/sharding/test_pipeline_parallel.py, tests/jaxinfer/engine/
test_data_parallel.py, test_multi_process.py and test_ray_executor.py;
here each flag is shown to be acted on: on the walk's one CPU device a
layout that needs more devices is refused naming them, the backend flags
select their executor, and the multi-process flags must come together."""

from __future__ import annotations

import pytest

from jaxinfer.config import EngineArgs

from .registry import row_check


@row_check("engine_args", "pipeline_parallel_size", "data_parallel_size")
def layouts_ask_for_their_devices(make_llm, walk_model):
    from jaxinfer.errors import InvalidConfigError
    for field in ("pipeline_parallel_size", "data_parallel_size"):
        with pytest.raises(InvalidConfigError, match="needs 2 devices"):
            make_llm(**{field: 2})
    for pp, dp in ((2, 1), (1, 3)):
        cfg = EngineArgs(model=walk_model, pipeline_parallel_size=pp,
                         data_parallel_size=dp).parallel_config()
        assert cfg.world_size == pp * dp


@row_check("engine_args", "distributed_executor_backend")
@row_check("engine_args_jaxinfer", "worker_use_ray")
def backend_flags_pick_the_executor(walk_model, rows):
    from jaxinfer.errors import InvalidConfigError
    assert EngineArgs(model=walk_model).parallel_config().backend == "uni"
    assert EngineArgs(model=walk_model, worker_use_ray=True
                      ).parallel_config().backend == "ray"
    assert EngineArgs(model=walk_model, distributed_executor_backend="ray"
                      ).parallel_config().backend == "ray"
    with pytest.raises(InvalidConfigError, match="worker_use_ray"):
        EngineArgs(model=walk_model, worker_use_ray=True,
                   distributed_executor_backend="mp")


@row_check("engine_args_jaxinfer", "distributed_coordinator", "num_processes",
           "process_id")
def multi_process_flags_come_together(walk_model):
    from jaxinfer.errors import InvalidConfigError
    cfg = EngineArgs(model=walk_model, distributed_coordinator="127.0.0.1:1234",
                     num_processes=2, process_id=1).parallel_config()
    assert cfg.multi_process and cfg.process_id == 1
    with pytest.raises(InvalidConfigError):  # an id with no process count
        EngineArgs(model=walk_model, process_id=1)


@row_check("serve_flags", "pipeline_parallel_size", "data_parallel_size",
           "distributed_executor_backend")
def parallel_serve_flags_reach_the_engine(rows):
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    def parse(*flags):
        return serve_engine_args(build_parser().parse_args(["serve", "m", *flags]))
    assert parse("--pipeline-parallel-size", "2").pipeline_parallel_size == 2
    assert parse("--data-parallel-size", "2").data_parallel_size == 2
    assert parse("--distributed-executor-backend", "ray",
                 "--pipeline-parallel-size", "2").distributed_executor_backend == "ray"
