"""The type check passes over the whole package and resolves every import.

mypy follows ``jaxinfer.models``, ``jaxinfer.pallas_kernels`` and
``jaxinfer.sharding`` through the links inside ``jaxinfer/``; an import that
names a module no checker can find (or a third-party library with no type
information that pyproject.toml does not list) fails here. Type errors of
other kinds fail it as well: pyproject.toml sets how strict the check
is per package (every function annotated in the engine's core packages).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
UNRESOLVED = re.compile(
    r"\[import-not-found\]|\[import-untyped\]|Cannot find implementation")


@pytest.mark.slow
def test_type_check_passes_over_every_module():
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    lines = run.stdout.splitlines()
    assert not [line for line in lines if UNRESOLVED.search(line)], run.stdout
    # The run covered every module of the package, the linked folders too.
    modules = sum(1 for _ in (ROOT / "jaxinfer").glob("**/*.py")) + sum(
        1 for name in ("models", "pallas_kernels", "sharding")
        for _ in (ROOT / name).glob("**/*.py"))
    checked = re.search(r"(?:checked|in) (\d+) source files", run.stdout)
    assert checked, run.stdout + run.stderr
    assert int(checked.group(1)) == modules
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]

