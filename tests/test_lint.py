"""The lint configured in pyproject.toml ([tool.ruff]) passes over the whole
repository, as the pre-commit hook runs it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
