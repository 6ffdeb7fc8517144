"""What the accuracy scripts (fp8_schemes_accuracy.py,
int8_clip_accuracy.py) share: the float model's 1,000 teacher-forced
positions of tests/models/test_quantized_accuracy.py with their logits,
and the results file each writes."""

from __future__ import annotations

import dataclasses
import json
import os

from benchmarks.run_stamp import run_stamp
from jaxinfer.models import resolve_model
from jaxinfer.models.quantization.config import QuantizationConfig
from tests.models import test_quantized_accuracy as T


def with_scheme(method: str, scheme):
    """The embedded model quantized at load with ``method`` as
    ``quantization=method`` resolves it, but with ``scheme``'s scales."""
    files = resolve_model(T.MODEL)
    return dataclasses.replace(files, config=dataclasses.replace(
        files.config, quantization=QuantizationConfig(method, "float",
                                                      scheme)))


def float_reference():
    """(trajectories, the float model's logits at their 1,000 positions)."""
    traj = T.float_trajectories()
    return traj, T._logits(resolve_model(T.MODEL), traj)


def write_results(name: str, rows: list, positions: int) -> str:
    """benchmarks/results/NAME-cpu.json from benchmarks/NAME.py's rows
    (NAME with dashes for the script's underscores)."""
    script = name.replace("-", "_") + ".py"
    out = dict(workload=name, model=T.MODEL, positions=positions,
               **run_stamp(),
               command=f"PYTHONPATH=$PWD python benchmarks/{script}",
               rows=rows)
    path = os.path.join(os.path.dirname(__file__), "results",
                        f"{name}-cpu.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return path
