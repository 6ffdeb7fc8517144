"""`jaxinfer serve`'s `serve()` on a tiny model, in a process of its own, for
the lifecycle tests (SIGTERM, engine death, exit status).

    python -m tests.jaxinfer.entrypoints.lifecycle_server MODEL PORT GRACE CONTROL_DIR

Files the test creates in CONTROL_DIR steer the engine's step: ``fault``
makes it raise (a planted fault in the loop, as a bug there would raise);
``slow`` makes each step take at least 20 ms, so that a request surely
outlasts a short grace period.
"""

from __future__ import annotations

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
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.openai.api_server import serve
    args = EngineArgs(model=model, max_model_len=512, num_gpu_blocks_override=256,
                      max_num_seqs=2, max_num_batched_tokens=128)
    engine = AsyncLLMEngine.from_engine_args(args)
    real_step = engine.engine.step

    def step():
        if os.path.exists(os.path.join(control, "fault")):
            raise RuntimeError("planted fault in the engine loop")
        if os.path.exists(os.path.join(control, "slow")):
            time.sleep(SLOW_STEP_S)
        elif os.path.exists(os.path.join(control, "paced")):
            time.sleep(PACED_STEP_S)
        return real_step()
    engine.engine.step = step
    return serve(args, port=port, served_model_names=["tiny"], engine=engine,
                 grace_period=grace, log_level="warning")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
