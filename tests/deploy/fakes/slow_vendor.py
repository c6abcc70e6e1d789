"""A vendor CLI that prints slowly: line ``i`` of ``SLOW_LINES`` lines, then it waits until the test has
seen that line (the file ``ack-<i>`` appears in the state directory) before printing the next. So a test can
tell, without timing anything, that output is shown while the tool still runs.

Every third line goes to stderr (builders print progress there). A line may carry the value of
``SLOW_SECRET`` (as a tool echoing its configuration would), which must never reach the screen or the log.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.deploy.fakes._runtime import STATE_ENV

#: A stuck test must not leave the fake waiting forever.
ACK_DEADLINE = 120.0


def main() -> int:
    state = Path(os.environ[STATE_ENV])
    count = int(os.environ.get("SLOW_LINES", "12"))
    secret = os.environ.get("SLOW_SECRET", "")
    for index in range(1, count + 1):
        stream = sys.stderr if index % 3 == 0 else sys.stdout
        extra = f" token={secret}" if secret and index == 2 else ""
        print(f"slow line {index}{extra}", file=stream, flush=True)
        ack = state / f"ack-{index}"
        deadline = time.monotonic() + ACK_DEADLINE
        while not ack.exists():
            if time.monotonic() > deadline:
                print(f"slow vendor: no ack for line {index}", file=sys.stderr, flush=True)
                return 3
            time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
