"""No model weights (or other large blobs) are
committed; tests build tiny random-weight checkpoints at run time."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt",
                   ".npz", ".npy", ".msgpack", ".h5", ".onnx")
MAX_BYTES = 1 << 20  # nothing tracked is larger than 1 MiB


def _tracked_files():
    if shutil.which("git") is None or not os.path.isdir(
            os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_weight_files_or_large_blobs_are_tracked():
    files = _tracked_files()
    assert files
    weights = [p for p in files if p.lower().endswith(WEIGHT_SUFFIXES)]
    assert not weights, f"weights are committed: {weights}"
    large = [(p, os.path.getsize(os.path.join(ROOT, p))) for p in files
             if os.path.isfile(os.path.join(ROOT, p))
             and os.path.getsize(os.path.join(ROOT, p)) > MAX_BYTES]
    assert not large, f"files over 1 MiB are committed: {large}"
