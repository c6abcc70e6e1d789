"""How long `offline --help` and `offline deploy --help` take as fresh processes (issue 7's target: <= 0.2 s).

Each command runs as a new interpreter, as a user's shell would start it, a few times; the best run is the
figure least disturbed by other load on the machine, the median shows the spread.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

#: The start-up budget of a help command, in seconds.
TARGET_SECONDS = 0.2
RUNS = 7
COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "deploy_help": ["deploy", "--help"],
}


def _timings(args: list[str], runs: int = RUNS) -> list[float]:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "offline_cli", *args], check=True, capture_output=True)
        timings.append(time.perf_counter() - start)
    return sorted(timings)


def run() -> dict[str, Any]:
    figures: dict[str, Any] = {"target_seconds": TARGET_SECONDS}
    for name, args in COMMANDS.items():
        timings = _timings(args)
        best = round(timings[0], 3)
        figures[name] = {
            "command": " ".join(["offline", *args]),
            "seconds_best": best,
            "seconds_median": round(timings[len(timings) // 2], 3),
            "within_target": best <= TARGET_SECONDS,
        }
    return figures
