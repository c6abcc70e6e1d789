"""Log lines a peer can cause, at a bounded rate: clients that vanish mid-session are routine (a phone going
through a tunnel, a NAT mapping dropped), and a flood of them must not grow the logs faster than a few lines a
minute. Past the budget, lines are counted and one summary says how many were suppressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

__all__ = ["LogBudget", "install_transport_warning_budget", "is_disconnect"]


class LogBudget:
    """At most ``burst`` lines at once, then one per ``period`` seconds (a token bucket); a line over budget
    is counted, and the count is logged once the period it fell in has passed."""

    def __init__(self, logger: logging.Logger, what: str, *, period: float = 30.0, burst: int = 1) -> None:
        self.logger = logger
        self.what = what  # names the suppressed lines in the summary
        self.period = period
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.suppressed = 0
        self._summary: asyncio.TimerHandle | None = None

    def allow(self) -> bool:
        """Take a token when one is left; else count the line as suppressed."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) / self.period)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.suppressed += 1
        if self._summary is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the next allowed line reports it
                self._summary = asyncio.get_running_loop().call_later(self.period, self.summarize)
        return False

    def log(self, level: int, message: str, *args: Any) -> None:
        if self.allow():
            self.summarize()
            self.logger.log(level, message, *args)

    def summarize(self) -> None:
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        if self.suppressed:
            count, self.suppressed = self.suppressed, 0
            self.logger.info("suppressed %d more %s", count, self.what)


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) only says the peer's connection is gone."""
    from starlette.websockets import WebSocketDisconnect

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (WebSocketDisconnect, ConnectionError, EOFError)):
            return True
        # uvicorn's ClientDisconnected, websockets' ConnectionClosed and Starlette's WebSocketDisconnected (a
        # send after an earlier one found the peer gone), by name: none is a type this module depends on.
        if type(current).__name__ in (
            "ClientDisconnected",
            "ConnectionClosed",
            "ConnectionClosedError",
            "WebSocketDisconnected",
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


class _TransportWarningBudget(logging.Filter):
    """asyncio warns once per write attempted after a connection was lost ("socket.send() raised
    exception."): one a reset peer, a bounded number overall."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = LogBudget(logging.getLogger("asyncio"), "'socket.send() raised exception.' warnings")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "socket.send() raised exception.":
            return True
        return self.budget.allow()


_installed: _TransportWarningBudget | None = None


def install_transport_warning_budget() -> None:
    global _installed
    if _installed is None:
        _installed = _TransportWarningBudget()
        logging.getLogger("asyncio").addFilter(_installed)
