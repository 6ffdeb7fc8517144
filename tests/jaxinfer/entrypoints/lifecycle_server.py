"""`jaxinfer serve`'s `serve()` on a tiny model, in a process of its own, for
the lifecycle tests (SIGTERM, engine death, exit status).

    python -m tests.jaxinfer.entrypoints.lifecycle_server MODEL PORT GRACE [FAULT_FILE]

With FAULT_FILE, the engine's step raises once that file exists: a planted
fault in the loop, as a bug there would raise.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    model, port, grace = argv[0], int(argv[1]), float(argv[2])
    fault_file = argv[3] if len(argv) > 3 else None
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.openai.api_server import serve
    args = EngineArgs(model=model, max_model_len=1024, num_gpu_blocks_override=256,
                      max_num_seqs=2, max_num_batched_tokens=128)
    engine = AsyncLLMEngine.from_engine_args(args)
    if fault_file is not None:
        real_step = engine.engine.step

        def step():
            if os.path.exists(fault_file):
                raise RuntimeError("planted fault in the engine loop")
            return real_step()
        engine.engine.step = step
    return serve(args, port=port, served_model_names=["tiny"], engine=engine,
                 grace_period=grace, log_level="warning")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
