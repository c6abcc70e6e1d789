"""Session lookups the live sync sessions need: which of these sessions have ended, and a user's live ones.

Kept apart from ``storage`` (one module per concept); works on the transactions of every store kind. A
session that is revoked or no longer stored (its user deleted, or purged after its refresh tokens expired)
has ended.
"""

from __future__ import annotations

from collections.abc import Sequence

from .storage import AuthTx, _MemoryTx, _SqlTx

__all__ = ["ended_sessions", "live_session_ids"]

#: Ids in one ``IN (...)`` list: well inside SQLite's and PostgreSQL's parameter limits.
_CHUNK = 500


async def ended_sessions(tx: AuthTx, session_ids: Sequence[str]) -> set[str]:
    """The ids among ``session_ids`` whose sessions are revoked or gone."""
    if isinstance(tx, _MemoryTx):
        return {
            sid for sid in session_ids if (s := tx.d.sessions.get(sid)) is None or s.revoked_at is not None
        }
    assert isinstance(tx, _SqlTx)
    live: set[str] = set()
    for start in range(0, len(session_ids), _CHUNK):
        chunk = list(session_ids[start : start + _CHUNK])
        rows = await tx.c.fetch(
            "SELECT id FROM offline_auth_sessions WHERE revoked_at IS NULL AND id IN "
            f"({', '.join('?' * len(chunk))})",
            *chunk,
        )
        live.update(str(row[0]) for row in rows)
    return set(session_ids) - live


async def live_session_ids(tx: AuthTx, user_id: str) -> list[str]:
    """The ids of ``user_id``'s sessions that are not revoked."""
    if isinstance(tx, _MemoryTx):
        return [s.id for s in tx.d.sessions.values() if s.user_id == user_id and s.revoked_at is None]
    assert isinstance(tx, _SqlTx)
    rows = await tx.c.fetch(
        "SELECT id FROM offline_auth_sessions WHERE user_id = ? AND revoked_at IS NULL", user_id
    )
    return [str(row[0]) for row in rows]
