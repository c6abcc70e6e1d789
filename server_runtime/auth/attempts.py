"""Sign-in attempts shared by the server processes of one PostgreSQL database.

Each process keeps its own windows in memory (``sign_in_limits``), which is all a memory or SQLite store needs
(one process owns it). With PostgreSQL several processes may serve one database; each attempt that passes the
process's own windows then also reserves its place in table ``offline_auth_attempts``: in one transaction,
holding an advisory lock per window key, the windows are counted and, when all are below their limits, one
row per window is inserted under a reservation id. So concurrent guesses spread over processes get no more
tries than the limits either. A right password deletes its reservation (and the account-and-address
window's rows); a wrong one leaves its rows; rows older than the longest window are purged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from offline.core.uuid7 import generate_uuid_v7

if TYPE_CHECKING:
    from .storage import PostgresAuthStore

__all__ = ["SharedAttempts", "Window"]

#: (key, attempts allowed, window in seconds)
Window = tuple[str, int, float]

_TABLE = (
    "CREATE TABLE IF NOT EXISTS offline_auth_attempts "
    "(key TEXT NOT NULL, at BIGINT NOT NULL, reservation TEXT NOT NULL)"
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS offline_auth_attempts_key ON offline_auth_attempts (key, at)",
    "CREATE INDEX IF NOT EXISTS offline_auth_attempts_reservation ON offline_auth_attempts (reservation)",
)


class SharedAttempts:
    def __init__(self, auth_store: PostgresAuthStore) -> None:
        self._auth = auth_store
        # Advisory locks of this store's attempts: their own class id, derived from the store's lock key.
        self._lock_class = (auth_store._store.lock_key ^ 0x61747470) & 0x7FFFFFFF
        self._ready = False
        self._ready_lock = asyncio.Lock()

    async def _ensure_table(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            await self._auth._ensure_tables()
            async with self._auth._connection(transaction=True) as conn:
                await conn.fetch("SELECT pg_advisory_xact_lock(?, 0)", self._lock_class)
                for statement in (_TABLE, *_INDEXES):
                    await conn.execute(statement)
            self._ready = True

    async def reserve(self, windows: Sequence[Window], now_ms: int) -> str | float:
        """A reservation id when every window is below its limit (one row each is then counted), else the
        seconds until the fullest one has room."""
        await self._ensure_table()
        async with self._auth._connection(transaction=True) as conn:
            for key in sorted({w[0] for w in windows}):  # one order everywhere: no deadlock between processes
                await conn.fetch("SELECT pg_advisory_xact_lock(?, hashtext(?))", self._lock_class, key)
            waits: list[float] = []
            for key, attempts, window in windows:
                since = now_ms - int(window * 1000)
                rows = await conn.fetch(
                    "SELECT at FROM offline_auth_attempts WHERE key = ? AND at > ? ORDER BY at DESC"
                    " OFFSET ? LIMIT 1",
                    key,
                    since,
                    attempts - 1,
                )
                if rows:
                    waits.append((int(rows[0][0]) - since) / 1000)
            if waits:
                return max(max(waits), 0.001)
            reservation = generate_uuid_v7()
            for key, _, _ in windows:
                await conn.execute(
                    "INSERT INTO offline_auth_attempts (key, at, reservation) VALUES (?, ?, ?)",
                    key,
                    now_ms,
                    reservation,
                )
        return reservation

    async def take_back(self, reservation: str, *, reset: Sequence[str] = ()) -> None:
        """Forget ``reservation`` (the password was right, or never checked), and every row of ``reset``."""
        async with self._auth._connection(transaction=True) as conn:
            await conn.execute("DELETE FROM offline_auth_attempts WHERE reservation = ?", reservation)
            for key in reset:
                await conn.execute("DELETE FROM offline_auth_attempts WHERE key = ?", key)

    async def purge(self, before_ms: int) -> None:
        await self._ensure_table()
        async with self._auth._connection(transaction=True) as conn:
            await conn.execute("DELETE FROM offline_auth_attempts WHERE at < ?", before_ms)
