"""What a user installs works: the built wheel and a plain ``pip install .``,
each in a fresh virtual environment outside the checkout, import every module
from that environment and generate text with the embedded model.

The suite runs the offline form (no network: the environments reuse this
interpreter's dependencies); ``.ci/run`` also runs the full form, which
installs the dependencies from the package index as a user's pip does.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_and_source_installs_import_every_module_and_generate(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_install.py"),
         "--offline", "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Both environments reached the generation step.
    assert run.stdout.count("generated ' Paris") == 2, run.stdout[-3000:]
    wheel, = (tmp_path / "dist").glob("jaxinfer-*.whl")
    import zipfile
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every package folder of the source tree is in the wheel, and so is the
    # package data the code reads at run time.
    for folder in ("jaxinfer", "models", "pallas_kernels", "sharding"):
        for init in (ROOT / folder).glob("**/__init__.py"):
            rel = init.relative_to(ROOT)
            if folder != "jaxinfer":
                rel = Path("jaxinfer") / rel
            assert rel.as_posix() in names, rel
    assert "jaxinfer/compat/vllm_0_11_0.json" in names
