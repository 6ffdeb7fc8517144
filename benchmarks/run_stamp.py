"""What every results JSON records of its run: when, at which commit, and a
digest of the source that ran.

The GPU machine gets a copy of the working tree whose git HEAD can be older
than the tree itself (uncommitted work, or a stale copy of .git), so
``commit`` alone does not say what ran. ``source_sha256`` hashes the Python
source of the four packages and benchmarks/; to tell which commit a results
file came from, compute it for a checkout of that commit:

    git archive COMMIT | tar -x -C /tmp/at && python benchmarks/run_stamp.py /tmp/at
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import sys

SOURCE_DIRS = ("jaxinfer", "models", "pallas_kernels", "sharding", "benchmarks")


def source_sha256(root: str | None = None) -> str:
    """sha256 over each .py file's relative path and bytes, in path order,
    under SOURCE_DIRS of ``root`` (default: this checkout). Links are not
    followed, so the package's links to its sibling folders count once."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = []
    for top in SOURCE_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__"
                             and not os.path.islink(os.path.join(d, x)))
            paths += [os.path.join(d, f) for f in files if f.endswith(".py")
                      and not os.path.islink(os.path.join(d, f))]
    h = hashlib.sha256()
    for path in sorted(paths):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        h.update(rel.encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()


def run_stamp() -> dict:
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                commit=subprocess.run(["git", "rev-parse", "HEAD"],
                                      capture_output=True, text=True).stdout.strip(),
                source_sha256=source_sha256())


if __name__ == "__main__":
    print(source_sha256(sys.argv[1] if len(sys.argv) > 1 else None))
