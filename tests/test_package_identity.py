"""One module identity per file: the sibling folders load only as
``jaxinfer.models`` / ``jaxinfer.pallas_kernels`` / ``jaxinfer.sharding``."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["models", "pallas_kernels", "sharding"])
def test_bare_name_is_refused_from_the_repo_root(name):
    # From the repo root the folder is on sys.path as a top-level name; the
    # package must refuse it instead of loading a second copy of each class.
    code = (f"import jaxinfer.{name} as a\n"
            f"try:\n    import {name}\nexcept ImportError as e:\n"
            f"    print('refused', e)\nelse:\n    print('loaded twice')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("refused"), out
    assert f"jaxinfer.{name}" in out


def test_errors_are_one_class_whichever_way_they_are_reached():
    from jaxinfer.models import ModelConfigError
    from jaxinfer.models.errors import ModelConfigError as direct
    assert ModelConfigError is direct
    assert sys.modules["jaxinfer.models.errors"].__file__.startswith(
        str(ROOT / "jaxinfer" / "models"))


def test_links_point_at_the_top_level_folders():
    for name in ("models", "pallas_kernels", "sharding"):
        link = ROOT / "jaxinfer" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()
