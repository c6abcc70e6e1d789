"""Signed-in dashboard browsers: random session ids held by the server, each with an expiry.

The cookie holds only the id; the server keeps a hash of it (a lookup's timing then says nothing about live
ids) with the time it expires. Signing out removes the id, so a copied cookie dies with it; restarting the
process ends every session. Sessions live in this process's memory: behind a load balancer with several
processes, a browser signs in again on the process it reaches.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["DEFAULT_TTL", "DashboardSessions"]

#: Seconds a sign-in lasts (``OFFLINE_DASHBOARD_SESSION_SECONDS``).
DEFAULT_TTL = 12 * 3600.0


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


class DashboardSessions:
    """At most ``max_sessions`` live sessions; a new one beyond that ends the oldest."""

    def __init__(
        self,
        ttl: float = DEFAULT_TTL,
        *,
        max_sessions: int = 1000,
        now: Callable[[], float] | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("a dashboard session must last a positive number of seconds")
        self.ttl = float(ttl)
        self.max_sessions = max_sessions
        self._now = now or time.monotonic
        self._expiry: OrderedDict[str, float] = OrderedDict()  # hash of the id -> when it expires

    def create(self) -> str:
        session_id = secrets.token_urlsafe(32)
        self._expiry[_key(session_id)] = self._now() + self.ttl
        while len(self._expiry) > self.max_sessions:
            self._expiry.popitem(last=False)
        return session_id

    def valid(self, session_id: str | None) -> bool:
        if not session_id:
            return False
        key = _key(session_id)
        expires = self._expiry.get(key)
        if expires is None:
            return False
        if self._now() >= expires:
            del self._expiry[key]
            return False
        return True

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._expiry.pop(_key(session_id), None)

    def __len__(self) -> int:
        return len(self._expiry)
