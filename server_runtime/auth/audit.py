"""The audit log of security events: who did what to which account, when and from where; never a secret.

Code that changes or tests an account's security calls ``routes.audit.record(kind, actor=..., subject=...,
address=..., detail=...)`` (``AuthRoutes.audit``, an ``AuditLog``). The entry is stored in the server's auth
store (table ``offline_auth_audit`` on SQLite and PostgreSQL, a dict in memory), then handed to every
listener: the production server publishes it as an ``audit`` event on ``/__offline/events``. The admin reads
the log with ``GET /__offline/audit`` (``server_runtime.user_admin``).

An entry: ``{id, at, kind, actor, subject, address, detail}``. ``actor`` is who acted (``user:<id>``,
``admin``, or None for an anonymous caller such as a failed sign-in), ``subject`` the user id concerned
(None when unknown), ``address`` the client address, ``detail`` a small JSON object. Kinds in use:

- ``sign-up``, ``sign-in`` (detail ``method``: ``password``, ``oauth:<provider>``, ``passkey``, ``mfa``),
  ``sign-in-failed`` (detail ``reason``: ``invalid-credentials``, ``user-disabled``, ``invalid-mfa-code``;
  ``email`` when given), ``sign-out``, ``sessions-revoked`` (by the user), ``refresh-reused``;
- ``mfa-enabled``, ``mfa-disabled``, ``passkey-added``, ``passkey-removed``, ``identity-linked``;
- ``user-disabled``, ``user-enabled``, ``user-signed-out``, ``user-deleted`` (actor ``admin``);
- ``password-reset-requested`` (detail ``email``, ``sent``; subject None for an address without an account),
  ``password-reset`` (detail ``sessionsRevoked``), ``password-reset-failed``, ``email-verified``;
  ``sign-in-failed`` with reason ``email-not-verified``;
- others may add kinds: a kind is a short lowercase name.

No secret ever enters an entry: ``detail`` keeps only scalar values (and lists of strings) under keys that do
not name a secret (any key containing ``password``, ``token``, ``secret``, ``code``, ``hash``, ``key`` or
``otp`` is dropped), strings are cut to ``_MAX_TEXT`` characters. Callers pass ids, emails, providers and
reasons, never what the user typed as a credential.

Growth is bounded (``AuditRetention``): entries older than ``max_age_days`` (default 90) and all but the
newest ``max_entries`` (default 100,000) are deleted, checked on the first entry a process records and then
every ``_TRIM_EVERY`` entries. ``OFFLINE_AUDIT_MAX_ENTRIES`` and ``OFFLINE_AUDIT_MAX_AGE_DAYS`` set them for a
server built from the environment (``settings``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from offline.core.errors import OfflineError
from offline.core.uuid7 import generate_uuid_v7

from .tokens import AUTH_CONFIG

if TYPE_CHECKING:
    from .storage import AuthStore, AuthTx

__all__ = [
    "AUDIT_TABLES",
    "AuditEntry",
    "AuditLog",
    "AuditQuery",
    "AuditRetention",
    "clean_detail",
    "user_actor",
]

log = logging.getLogger("offline.server.auth")

_MAX_TEXT: Final = 200
_MAX_ITEMS: Final = 20
_TRIM_EVERY: Final = 64
_KIND: Final = re.compile(r"^[a-z][a-z0-9.:-]{0,63}$")
# Keys naming something that may be a credential: such a value is never stored, whatever it holds.
_SECRET_KEY: Final = re.compile(
    r"password|token|secret|code|hash|key|otp|cookie|authorization", re.IGNORECASE
)

AUDIT_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS offline_auth_audit (
        id TEXT PRIMARY KEY,
        at BIGINT NOT NULL,
        kind TEXT NOT NULL,
        actor TEXT,
        subject TEXT,
        address TEXT,
        detail TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS offline_auth_audit_at ON offline_auth_audit (at)",
    "CREATE INDEX IF NOT EXISTS offline_auth_audit_subject ON offline_auth_audit (subject, id)",
)
_COLUMNS: Final = "id, at, kind, actor, subject, address, detail"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: str  # UUIDv7: ordered by time within a process (the log's paging cursor)
    at: int  # epoch milliseconds
    kind: str
    actor: str | None
    subject: str | None
    address: str | None
    detail: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        from .web import iso

        return {
            "id": self.id,
            "at": iso(self.at),
            "kind": self.kind,
            "actor": self.actor,
            "subject": self.subject,
            "address": self.address,
            "detail": dict(self.detail),
        }


@dataclass(frozen=True, slots=True)
class AuditRetention:
    """How much of the log is kept: at most ``max_entries`` entries, none older than ``max_age_days``."""

    max_entries: int = 100_000
    max_age_days: float = 90.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_entries, bool)
            or not isinstance(self.max_entries, int)
            or self.max_entries < 1
        ):
            raise OfflineError(
                "audit max_entries must be a whole number of at least 1",
                AUTH_CONFIG,
                {"field": "max_entries"},
            )
        days = self.max_age_days
        if (
            isinstance(days, bool)
            or not isinstance(days, (int, float))
            or not (days > 0 and math.isfinite(days))
        ):
            raise OfflineError(
                "audit max_age_days must be a positive number of days", AUTH_CONFIG, {"field": "max_age_days"}
            )


def clean_detail(detail: Mapping[str, Any] | None) -> dict[str, Any]:
    """``detail`` without anything that could be a secret (see the module docstring)."""
    out: dict[str, Any] = {}
    for key, value in (detail or {}).items():
        if not isinstance(key, str) or _SECRET_KEY.search(key) or len(out) >= _MAX_ITEMS:
            continue
        if (
            value is None
            or isinstance(value, (bool, int))
            or (isinstance(value, float) and math.isfinite(value))
        ):
            out[key] = value
        elif isinstance(value, str):
            out[key] = value[:_MAX_TEXT]
        elif isinstance(value, (list, tuple)):
            out[key] = [str(item)[:_MAX_TEXT] for item in value[:_MAX_ITEMS] if isinstance(item, str)]
    return out


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of a read, newest first: ``kinds`` (any of), ``user`` (as subject or actor ``user:<id>``),
    ``since``/``until`` (epoch ms, inclusive), ``before`` (an entry id: the page after it), ``limit``."""

    kinds: tuple[str, ...] = ()
    user: str | None = None
    since: int | None = None
    until: int | None = None
    before: str | None = None
    limit: int = 100

    def matches(self, entry: AuditEntry) -> bool:
        return (
            (not self.kinds or entry.kind in self.kinds)
            and (self.user is None or entry.subject == self.user or entry.actor == f"user:{self.user}")
            and (self.since is None or entry.at >= self.since)
            and (self.until is None or entry.at <= self.until)
            and (self.before is None or entry.id < self.before)
        )


def _entry(row: Sequence[Any]) -> AuditEntry:
    try:
        detail = json.loads(row[6])
    except (TypeError, ValueError):
        detail = {}
    return AuditEntry(str(row[0]), int(row[1]), str(row[2]), row[3], row[4], row[5], detail)


async def insert_entry(tx: AuthTx, entry: AuditEntry) -> None:
    from .storage import _MemoryTx, _SqlTx

    if isinstance(tx, _MemoryTx):
        tx._set(tx.d.audit, entry.id, entry)
        return
    assert isinstance(tx, _SqlTx)
    tx._writing()
    await tx.c.execute(
        f"INSERT INTO offline_auth_audit ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        entry.id,
        entry.at,
        entry.kind,
        entry.actor,
        entry.subject,
        entry.address,
        json.dumps(dict(entry.detail), separators=(",", ":")),
    )


async def read_entries(tx: AuthTx, query: AuditQuery) -> list[AuditEntry]:
    """Up to ``query.limit`` entries matching ``query``, newest first."""
    from .storage import _MemoryTx, _SqlTx

    if isinstance(tx, _MemoryTx):
        found: list[AuditEntry] = []
        for entry in sorted(tx.d.audit.values(), key=lambda e: e.id, reverse=True):
            if query.matches(entry):
                found.append(entry)
                if len(found) >= query.limit:
                    break
        return found
    assert isinstance(tx, _SqlTx)
    where: list[str] = []
    args: list[Any] = []
    if query.kinds:
        where.append(f"kind IN ({', '.join('?' * len(query.kinds))})")
        args.extend(query.kinds)
    if query.user is not None:
        where.append("(subject = ? OR actor = ?)")
        args.extend([query.user, f"user:{query.user}"])
    for clause, value in (("at >= ?", query.since), ("at <= ?", query.until), ("id < ?", query.before)):
        if value is not None:
            where.append(clause)
            args.append(value)
    sql = f"SELECT {_COLUMNS} FROM offline_auth_audit"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = await tx.c.fetch(sql + " ORDER BY id DESC LIMIT ?", *args, query.limit)
    return [_entry(row) for row in rows]


async def trim_entries(tx: AuthTx, *, older_than: int, keep: int) -> int:
    """Delete entries recorded before ``older_than`` (epoch ms) and all but the newest ``keep``."""
    from .storage import _MemoryTx, _SqlTx

    if isinstance(tx, _MemoryTx):
        ordered = sorted(tx.d.audit.values(), key=lambda e: e.id, reverse=True)
        doomed = [e.id for i, e in enumerate(ordered) if i >= keep or e.at < older_than]
        for entry_id in doomed:
            tx._delete(tx.d.audit, entry_id)
        return len(doomed)
    assert isinstance(tx, _SqlTx)
    tx._writing()
    removed = await tx.c.execute("DELETE FROM offline_auth_audit WHERE at < ?", older_than)
    boundary = await tx.c.fetch("SELECT id FROM offline_auth_audit ORDER BY id DESC LIMIT 1 OFFSET ?", keep)
    if boundary:
        removed += await tx.c.execute("DELETE FROM offline_auth_audit WHERE id <= ?", str(boundary[0][0]))
    return removed


class AuditLog:
    """Records entries in an auth store and hands each to the listeners (the live event stream)."""

    def __init__(
        self,
        store: Callable[[], AuthStore],
        *,
        retention: AuditRetention | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        self._store = store
        self.retention = retention or AuditRetention()
        self._now = now or time.time
        self._since_trim: int | None = None  # None: not trimmed yet by this process
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    def __repr__(self) -> str:
        return f"AuditLog({self.retention!r})"

    async def record(
        self,
        kind: str,
        *,
        actor: str | None = None,
        subject: str | None = None,
        address: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> AuditEntry | None:
        """Store one entry (its own transaction, after the caller's has committed) and publish it. A store
        that cannot be written is logged, never raised: the action being audited has already happened."""
        if not _KIND.match(kind):
            raise ValueError(f"audit kind {kind!r} must be a short lowercase name such as 'sign-in'")
        entry = AuditEntry(
            generate_uuid_v7(),
            int(self._now() * 1000),
            kind,
            actor,
            subject,
            address,
            clean_detail(detail),
        )
        try:
            async with self._store().transaction() as tx:
                await insert_entry(tx, entry)
                if self._since_trim is None or self._since_trim >= _TRIM_EVERY:
                    await self._trim(tx, entry.at)
                    self._since_trim = 0
                self._since_trim += 1
        except OfflineError as exc:
            log.error("could not record the audit entry %s: [%s] %s", kind, exc.code, exc.message)
            return None
        payload = entry.to_json()
        for listener in list(self.listeners):
            try:
                listener(payload)
            except Exception:
                log.exception("an audit listener failed")
        return entry

    async def _trim(self, tx: AuthTx, now: int) -> None:
        cutoff = now - int(self.retention.max_age_days * 86_400_000)
        removed = await trim_entries(tx, older_than=cutoff, keep=self.retention.max_entries)
        if removed:
            log.info("audit log: %d old entr%s deleted (retention)", removed, "y" if removed == 1 else "ies")

    async def entries(self, query: AuditQuery) -> list[AuditEntry]:
        async with self._store().reader() as tx:
            return await read_entries(tx, query)


def user_actor(user_id: str) -> str:
    """The ``actor`` of an entry for something a signed-in user did."""
    return f"user:{user_id}"
