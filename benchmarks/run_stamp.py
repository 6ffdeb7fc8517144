"""What every results JSON records of its run: when, and at which commit."""

from __future__ import annotations

import datetime
import subprocess


def run_stamp() -> dict:
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                commit=subprocess.run(["git", "rev-parse", "HEAD"],
                                      capture_output=True, text=True).stdout.strip())
