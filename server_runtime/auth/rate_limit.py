"""Sliding-window limits (in memory, per process) and the settings of every auth limit (``RateLimits``).

Each key keeps the times of its recent events; once ``attempts`` of them fall inside the last ``window``
seconds, further attempts are refused until the oldest one leaves the window. How sign-ins use them is in
``sign_in_limits``; server processes sharing a PostgreSQL database also count sign-ins there (``attempts``).
The other windows (sign-ups, second-factor codes, emailed tokens) are kept per process.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from offline.core.errors import OfflineError

from .tokens import AUTH_CONFIG

__all__ = ["RateLimits", "SlidingWindow", "rate_limits_from"]


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Failed sign-ins allowed within a window (seconds): per account from one client address
    (``account_attempts``), per address over all accounts (``address_attempts``), and per account over all
    addresses (``account_total_attempts``; past it only addresses that signed in to that account before may
    try). Sign-ups allowed per address (each costs a password hash); wrong second-factor codes allowed per
    account. Password checks (argon2) the process queues: at most ``password_checks_waiting`` waiting for a
    worker, at most ``password_checks_per_address`` waiting or running for one address.

    Emailed tokens: ``email_requests`` password-reset requests per email address (known or not: a 429
    reveals nothing) and verification emails per account, and ``email_requests_per_address`` requests per
    client address, within ``email_window``; at most ``email_requests`` messages actually go to one account
    per window (more are dropped silently). ``token_attempts`` wrong or spent tokens per client address
    within ``token_window`` (password-reset completion and email verification)."""

    account_attempts: int = 5
    account_window: float = 900.0
    address_attempts: int = 20
    address_window: float = 900.0
    account_total_attempts: int = 20
    sign_up_attempts: int = 20
    sign_up_window: float = 3600.0
    mfa_attempts: int = 5
    mfa_window: float = 900.0
    password_checks_waiting: int = 8
    password_checks_per_address: int = 2
    email_requests: int = 5
    email_requests_per_address: int = 20
    email_window: float = 3600.0
    token_attempts: int = 10
    token_window: float = 900.0


def rate_limits_from(value: RateLimits | Mapping[str, Any] | None) -> RateLimits:
    """``RateLimits`` from itself, a dict of its field names (snake_case or camelCase), or None (defaults)."""
    if value is None:
        return RateLimits()
    if isinstance(value, RateLimits):
        limits = value
    else:
        names = {f.name for f in fields(RateLimits)}
        camel = {_camel(n): n for n in names}
        given: dict[str, Any] = {}
        for key, item in value.items():
            name = key if key in names else camel.get(key)
            if name is None:
                raise OfflineError(
                    f"unknown rate limit {key!r}; known: {', '.join(sorted(names))}",
                    AUTH_CONFIG,
                    {"field": f"rate_limits.{key}"},
                )
            given[name] = item
        limits = RateLimits(**given)
    for f in fields(limits):
        number = getattr(limits, f.name)
        if not isinstance(number, (int, float)) or isinstance(number, bool) or number <= 0:
            raise OfflineError(
                f"rate limit {f.name} must be a positive number, got {number!r}",
                AUTH_CONFIG,
                {"field": f"rate_limits.{f.name}"},
            )
    return limits


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class SlidingWindow:
    """At most ``attempts`` recorded events per key within ``window`` seconds. Memory is bounded: at most
    ``max_keys`` keys are kept; when full, the key touched least recently is forgotten."""

    def __init__(
        self,
        attempts: int,
        window: float,
        *,
        max_keys: int = 100_000,
        now: Callable[[], float] | None = None,
    ) -> None:
        self.attempts = int(attempts)
        self.window = float(window)
        self.max_keys = max_keys
        self._now = now or time.monotonic
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        events = self._events.get(key)
        if events is None:
            return None
        while events and events[0] <= now - self.window:
            events.popleft()
        if not events:
            del self._events[key]
            return None
        return events

    def retry_after(self, key: str) -> float | None:
        """Seconds until ``key`` may try again, or None when it may try now."""
        now = self._now()
        events = self._recent(key, now)
        if events is None or len(events) < self.attempts:
            return None
        # The attempt becomes possible when enough of the oldest events have left the window.
        return max(events[len(events) - self.attempts] + self.window - now, 0.001)

    def hit(self, key: str) -> float:
        """Record one event for ``key``; returns its stamp (for ``unhit``)."""
        now = self._now()
        events = self._recent(key, now)
        if events is None:
            events = self._events[key] = deque(maxlen=self.attempts)
            while len(self._events) > self.max_keys:
                self._events.popitem(last=False)
        else:
            self._events.move_to_end(key)
        events.append(now)
        return now

    def unhit(self, key: str, stamp: float) -> None:
        """Take back the event ``hit`` recorded at ``stamp`` (an attempt that turned out not to count)."""
        events = self._events.get(key)
        if events is None:
            return
        with contextlib.suppress(ValueError):  # already slid out of the window (or pushed out)
            events.remove(stamp)
        if not events:
            del self._events[key]

    def reset(self, key: str) -> None:
        self._events.pop(key, None)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
