"""How long `offline --help` takes as a fresh process (issue 7's target: <= 0.2 s)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any


def run() -> dict[str, Any]:
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "offline_cli", "--help"], check=True, capture_output=True)
        timings.append(time.perf_counter() - start)
    return {"help_seconds_best": round(min(timings), 3), "help_seconds_median": round(sorted(timings)[2], 3)}
