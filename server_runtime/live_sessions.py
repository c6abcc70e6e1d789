"""Live sync sessions by the credentials that opened them: revocation and token expiry end them.

An accepted sync session registers what its auth provider says about its token (``SessionBinding``): the auth
session id (the token's ``sid``) and when the token expires (``exp``, epoch seconds). Then:

- at the expiry a timer ends the sync session with ``error TOKEN_EXPIRED`` (retriable: the client refreshes
  its token and reconnects);
- when the auth session is revoked the sync session ends with ``error SESSION_REVOKED`` (not retriable
  without new credentials). The provider reports revocations made through this process at once
  (``subscribe_revocations``); every ``poll_interval`` seconds the ids of the live sessions are also checked
  against the store (``ended_sessions``), which catches revocations made by another server process sharing
  the database, by an administrator, or by anything else that writes the store. A poll of the live ids (by
  primary key) is used rather than a LISTEN/NOTIFY channel: it works for every store kind, needs no
  connection of its own, and a notification lost while a listener reconnects cannot leave a revoked session
  open; its cost is one indexed query a second per process while sessions are open.

A provider without these hooks (a custom callable) gets expiry from the claims' ``exp`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("offline.server.sync")

#: ``Connection.leaving`` reasons of a session ended by its credentials (see ``endpoint``).
REVOKED = "revoked"
EXPIRED = "expired"

#: Session ids checked against the store in one query.
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class SessionBinding:
    """What a connection's credentials are tied to: the auth session id (None: none to revoke) and the
    token's expiry in epoch seconds (None: it does not expire)."""

    session_id: str | None
    expires_at: float | None


def binding_of(auth: Any, claims: Mapping[str, Any] | None) -> SessionBinding:
    """The provider's ``session_binding(claims)`` when it has one, else the expiry in the claims' ``exp``."""
    describe = getattr(auth, "session_binding", None)
    if describe is not None and claims is not None:
        binding = describe(claims)
        if isinstance(binding, SessionBinding):
            return binding
    exp = claims.get("exp") if claims is not None else None
    expires = float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None
    return SessionBinding(None, expires)


@dataclass(slots=True, eq=False)
class LiveEntry:
    binding: SessionBinding
    end: Callable[[str], None]
    timer: asyncio.TimerHandle | None = field(default=None)


class LiveSessions:
    """Auth session id -> the live sync sessions it holds open (one ``SyncService`` each)."""

    def __init__(
        self, auth: Any, *, poll_interval: float = 1.0, now: Callable[[], float] | None = None
    ) -> None:
        self.auth = auth
        self.poll_interval = poll_interval
        self._now = now or time.time
        self._by_id: dict[str, set[LiveEntry]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._ended_sessions: Callable[[list[str]], Awaitable[Collection[str]]] | None = getattr(
            auth, "ended_sessions", None
        )

    def start(self) -> None:
        subscribe = getattr(self.auth, "subscribe_revocations", None)
        if subscribe is not None:
            subscribe(self.revoked)

    async def stop(self) -> None:
        unsubscribe = getattr(self.auth, "unsubscribe_revocations", None)
        if unsubscribe is not None:
            unsubscribe(self.revoked)
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(BaseException):
                await poller

    def add(self, claims: Mapping[str, Any] | None, end: Callable[[str], None]) -> LiveEntry:
        """Track a sync session; ``end(reason)`` asks it to leave (``REVOKED`` or ``EXPIRED``)."""
        entry = LiveEntry(binding_of(self.auth, claims), end)
        expires = entry.binding.expires_at
        if expires is not None:
            loop = asyncio.get_running_loop()
            entry.timer = loop.call_later(max(0.0, expires - self._now()), end, EXPIRED)
        sid = entry.binding.session_id
        if sid is not None:
            self._by_id.setdefault(sid, set()).add(entry)
            if self._ended_sessions is not None and (self._poller is None or self._poller.done()):
                self._poller = asyncio.create_task(self._poll(), name="offline-session-revocations")
        return entry

    def discard(self, entry: LiveEntry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
        sid = entry.binding.session_id
        if sid is not None:
            entries = self._by_id.get(sid)
            if entries is not None:
                entries.discard(entry)
                if not entries:
                    del self._by_id[sid]

    def session_ids(self) -> list[str]:
        return list(self._by_id)

    def revoked(self, session_ids: Iterable[str]) -> int:
        """End every live sync session of these auth sessions (SESSION_REVOKED); how many were asked to."""
        ended = 0
        for sid in session_ids:
            for entry in list(self._by_id.get(sid, ())):
                entry.end(REVOKED)
                ended += 1
        if ended:
            log.info("ended %d sync session(s) of revoked auth sessions", ended)
        return ended

    async def _poll(self) -> None:
        check = self._ended_sessions
        assert check is not None
        while self._by_id:
            await asyncio.sleep(self.poll_interval)
            ids = self.session_ids()
            for start in range(0, len(ids), _CHUNK):
                try:
                    ended = await check(ids[start : start + _CHUNK])
                except Exception as exc:  # the store is unreachable for now: the next round tries again
                    log.warning("could not check sync sessions for revocation: %s", exc)
                    break
                if ended:
                    self.revoked(ended)
