"""`jaxinfer serve` on a tiny model, in a process of its own, for the
lifecycle tests (SIGTERM, engine death, exit status).

    python -m tests.jaxinfer.entrypoints.lifecycle_server MODEL PORT GRACE CONTROL_DIR [MODE]

MODE ``single`` (the default): `serve()`, the engine in the HTTP process;
a number N: `serve_processes()`, an engine-core process and N front ends.

Files the test creates in CONTROL_DIR steer the engine's step: ``fault``
makes it raise (a planted fault in the loop, as a bug there would raise);
``slow`` makes each step take at least 20 ms, so that a request surely
outlasts a short grace period.
"""

from __future__ import annotations

import functools
import os
import sys
import time

SLOW_STEP_S = 0.02
# A step time of a real model (the tiny one steps in about 1 ms on two
# CPUs, with host/device overlap: draining a refused 10 MB body on the event
# loop, a fixed cost of 1-2 ms, would then read as a doubled gap).
PACED_STEP_S = 0.005


def main(argv: list[str]) -> int:
    model, port, grace, control = argv[0], int(argv[1]), float(argv[2]), argv[3]
    mode = argv[4] if len(argv) > 4 else "single"
    from jaxinfer.config import EngineArgs
    args = EngineArgs(model=model, max_model_len=512, num_gpu_blocks_override=256,
                      max_num_seqs=2, max_num_batched_tokens=128)
    if mode != "single":
        from jaxinfer.entrypoints.openai import serve_processes
        # The engine-core process steers its steps the same way.
        serve_processes._core_main = functools.partial(core_main, control)
        return serve_processes.serve_processes(
            args, api_server_count=int(mode), host="127.0.0.1", port=port,
            served_model_names=["tiny"], max_num_waiting=1024,
            grace_period=grace, log_level="warning")
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.openai.api_server import serve
    engine = AsyncLLMEngine.from_engine_args(args)
    engine.engine.step = functools.partial(steered_step, control,
                                           engine.engine.step)
    return serve(args, port=port, served_model_names=["tiny"], engine=engine,
                 grace_period=grace, log_level="warning")


def steered_step(control: str, real_step):
    if os.path.exists(os.path.join(control, "fault")):
        raise RuntimeError("planted fault in the engine loop")
    if os.path.exists(os.path.join(control, "slow")):
        time.sleep(SLOW_STEP_S)
    elif os.path.exists(os.path.join(control, "paced")):
        time.sleep(PACED_STEP_S)
    return real_step()


def core_main(control: str, *args) -> None:
    """The engine-core process, its engine's step steered by ``control``."""
    from jaxinfer.entrypoints.openai.serve_processes import _die_with_parent
    _die_with_parent()
    from jaxinfer.engine.core_process import run_engine_core
    from jaxinfer.engine.llm_engine import LLMEngine
    real_step = LLMEngine.step

    def step(self):
        return steered_step(control, functools.partial(real_step, self))
    LLMEngine.step = step  # type: ignore[method-assign]
    run_engine_core(*args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
