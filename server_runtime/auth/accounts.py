"""Accounts as an administrator sees them: search, a user's sessions and identities, disabling, deletion.

Kept apart from ``storage`` (one module per concept); the functions work on the transactions of every store
kind. A disabled account has a row in ``offline_auth_user_status`` (when, by whom, why); enabling deletes
it, so the users table itself never changes shape.

Deleting a user removes the account and everything that signs it in or describes it to the auth routes: its
row, provider identities, sessions, refresh tokens, TOTP enrolment and recovery codes, passkeys,
organization memberships (the organizations stay), pending challenges, emailed tokens, its verified address
and its disabled mark. The records it synced are application data and stay, as do the registrations of its
devices' node ids (so no other account can ever write as those devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .storage import AuthTx, Identity, SessionRow, User, _MemoryTx, _SqlTx

__all__ = [
    "ACCOUNT_TABLES",
    "AccountFacts",
    "DisabledRow",
    "clear_disabled",
    "delete_user",
    "disabled",
    "facts",
    "find_users",
    "lock_user",
    "set_disabled",
]

ACCOUNT_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS offline_auth_user_status (
        user_id TEXT PRIMARY KEY,
        disabled_at BIGINT NOT NULL,
        disabled_by TEXT,
        reason TEXT
    )""",
)


@dataclass(frozen=True, slots=True)
class DisabledRow:
    user_id: str
    disabled_at: int
    disabled_by: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class AccountFacts:
    """What ``GET /__offline/users/{id}`` shows besides the user: sessions, identities, second factors."""

    sessions: list[SessionRow]
    providers: list[str]
    totp_enabled: bool
    passkeys: int
    orgs: list[tuple[str, str]]  # (org id, role)


def _disabled_row(row: Sequence[Any]) -> DisabledRow:
    return DisabledRow(str(row[0]), int(row[1]), row[2], row[3])


async def disabled(tx: AuthTx, user_id: str) -> DisabledRow | None:
    """The user's disabled mark, None when the account is enabled."""
    if isinstance(tx, _MemoryTx):
        found: DisabledRow | None = tx.d.disabled.get(user_id)
        return found
    assert isinstance(tx, _SqlTx)
    row = await tx._one(
        "SELECT user_id, disabled_at, disabled_by, reason FROM offline_auth_user_status WHERE user_id = ?",
        user_id,
    )
    return None if row is None else _disabled_row(row)


async def set_disabled(tx: AuthTx, row: DisabledRow) -> bool:
    """Mark the account disabled; False (nothing changed) when it already was."""
    if isinstance(tx, _MemoryTx):
        if row.user_id in tx.d.disabled:
            return False
        tx._set(tx.d.disabled, row.user_id, row)
        return True
    assert isinstance(tx, _SqlTx)
    tx._writing()
    changed = await tx.c.execute(
        "INSERT INTO offline_auth_user_status (user_id, disabled_at, disabled_by, reason) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        row.user_id,
        row.disabled_at,
        row.disabled_by,
        row.reason,
    )
    return changed == 1


async def clear_disabled(tx: AuthTx, user_id: str) -> bool:
    """Enable the account again; False when it was not disabled."""
    if isinstance(tx, _MemoryTx):
        if user_id not in tx.d.disabled:
            return False
        tx._delete(tx.d.disabled, user_id)
        return True
    assert isinstance(tx, _SqlTx)
    tx._writing()
    return await tx.c.execute("DELETE FROM offline_auth_user_status WHERE user_id = ?", user_id) > 0


async def lock_user(tx: AuthTx, user_id: str) -> bool:
    """Whether the user exists. In a PostgreSQL transaction the user's row stays locked until it ends: opening
    a session and disabling or deleting the account then happen one after the other, so a sign-in racing a
    disable cannot leave a live session behind it (memory and SQLite transactions are exclusive already)."""
    if isinstance(tx, _MemoryTx):
        return user_id in tx.d.users
    assert isinstance(tx, _SqlTx)
    return bool(await tx.c.fetch("SELECT id FROM offline_auth_users WHERE id = ?" + tx.for_update, user_id))


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def find_users(
    tx: AuthTx, query: str | None, *, after: str | None, limit: int
) -> list[tuple[User, DisabledRow | None]]:
    """Users in id order (UUIDv7: sign-up order) after the id ``after``, at most ``limit``; ``query`` keeps
    those whose email contains it (case-insensitive) or whose id is it."""
    needle = query.strip().lower() if query else ""
    if isinstance(tx, _MemoryTx):
        found: list[tuple[User, DisabledRow | None]] = []
        for user in sorted(tx.d.users.values(), key=lambda u: u.id):
            if after is not None and user.id <= after:
                continue
            if needle and not (user.id == needle or (user.email is not None and needle in user.email)):
                continue
            found.append((user, tx.d.disabled.get(user.id)))
            if len(found) >= limit:
                break
        return found
    assert isinstance(tx, _SqlTx)
    where: list[str] = []
    args: list[Any] = []
    if after is not None:
        where.append("u.id > ?")
        args.append(after)
    if needle:
        # Emails are stored lower case, so LIKE on the lower-cased needle is case-insensitive everywhere.
        where.append("(u.id = ? OR u.email LIKE ? ESCAPE '\\')")
        args.extend([needle, _like(needle)])
    sql = (
        "SELECT u.id, u.email, u.password_hash, u.created_at, s.user_id, s.disabled_at, s.disabled_by, s.reason"
        " FROM offline_auth_users u LEFT JOIN offline_auth_user_status s ON s.user_id = u.id"
    )
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = await tx.c.fetch(sql + " ORDER BY u.id LIMIT ?", *args, limit)
    return [
        (
            User(str(row[0]), row[1], row[2], int(row[3])),
            None if row[4] is None else _disabled_row(row[4:8]),
        )
        for row in rows
    ]


async def facts(tx: AuthTx, user_id: str) -> AccountFacts:
    """The user's sessions (oldest first; revoked ones until they are purged), providers and factors."""
    orgs = [(org.id, membership.role) for org, membership in await tx.user_orgs(user_id)]
    totp = await tx.totp(user_id)
    passkeys = len(await tx.user_passkeys(user_id))
    if isinstance(tx, _MemoryTx):
        sessions = sorted(
            (s for s in tx.d.sessions.values() if s.user_id == user_id), key=lambda s: (s.created_at, s.id)
        )
        identities: list[Identity] = [i for i in tx.d.identities.values() if i.user_id == user_id]
        providers = sorted({i.provider for i in identities})
    else:
        assert isinstance(tx, _SqlTx)
        rows = await tx.c.fetch(
            "SELECT id, user_id, created_at, revoked_at, revoked_reason FROM offline_auth_sessions"
            " WHERE user_id = ? ORDER BY created_at, id",
            user_id,
        )
        sessions = [
            SessionRow(str(r[0]), str(r[1]), int(r[2]), None if r[3] is None else int(r[3]), r[4])
            for r in rows
        ]
        provider_rows = await tx.c.fetch(
            "SELECT DISTINCT provider FROM offline_auth_identities WHERE user_id = ? ORDER BY provider",
            user_id,
        )
        providers = [str(r[0]) for r in provider_rows]
    return AccountFacts(
        sessions=sessions,
        providers=providers,
        totp_enabled=totp is not None and totp.enabled_at is not None,
        passkeys=passkeys,
        orgs=orgs,
    )


async def delete_user(tx: AuthTx, user_id: str) -> bool:
    """Delete the account and its auth data (see the module docstring); False when there is no such user."""
    if isinstance(tx, _MemoryTx):
        d = tx.d
        user = d.users.get(user_id)
        if user is None:
            return False
        if user.email is not None:
            tx._delete(d.emails, user.email)
        tx._delete(d.users, user_id)
        sessions = {k for k, s in d.sessions.items() if s.user_id == user_id}
        emptied = {k[0] for k in d.members if k[1] == user_id} - {k[0] for k in d.members if k[1] != user_id}
        doomed: list[tuple[dict[Any, Any], list[Any]]] = [
            (d.identities, [k for k, i in d.identities.items() if i.user_id == user_id]),
            (d.sessions, list(sessions)),
            (d.refresh, [k for k, r in d.refresh.items() if r.user_id == user_id]),
            (d.totp, [user_id] if user_id in d.totp else []),
            (d.recovery, [k for k in d.recovery if k[0] == user_id]),
            (d.passkeys, [k for k, p in d.passkeys.items() if p.user_id == user_id]),
            (d.members, [k for k in d.members if k[1] == user_id]),
            (tx.x.invites, [k for k, i in tx.x.invites.items() if i.org_id in emptied]),
            (d.challenges, [k for k, c in d.challenges.items() if c.user_id == user_id]),
            (d.active, [k for k in d.active if k in sessions]),
            (d.disabled, [user_id] if user_id in d.disabled else []),
            (d.email_tokens, [k for k, t in d.email_tokens.items() if t.user_id == user_id]),
            (d.verified_emails, [user_id] if user_id in d.verified_emails else []),
        ]
        for table, keys in doomed:
            for key in keys:
                tx._delete(table, key)
        return True
    assert isinstance(tx, _SqlTx)
    tx._writing()
    if not await lock_user(tx, user_id):
        return False
    await tx.c.execute(
        "DELETE FROM offline_auth_active_orgs WHERE session_id IN"
        " (SELECT id FROM offline_auth_sessions WHERE user_id = ?)",
        user_id,
    )
    # An organization this user is the last member of keeps nobody to answer for it: its pending invites
    # go too, or accepting one would make a member of an organization without an owner.
    await tx.c.execute(
        "DELETE FROM offline_auth_invites WHERE org_id IN"
        " (SELECT org_id FROM offline_auth_memberships WHERE user_id = ?)"
        " AND NOT EXISTS (SELECT 1 FROM offline_auth_memberships m"
        " WHERE m.org_id = offline_auth_invites.org_id AND m.user_id <> ?)",
        user_id,
        user_id,
    )
    for name in (
        "offline_auth_identities",
        "offline_auth_refresh_tokens",
        "offline_auth_sessions",
        "offline_auth_totp",
        "offline_auth_recovery_codes",
        "offline_auth_passkeys",
        "offline_auth_memberships",
        "offline_auth_challenges",
        "offline_auth_user_status",
        "offline_auth_email_tokens",
        "offline_auth_verified_emails",
    ):
        await tx.c.execute(f"DELETE FROM {name} WHERE user_id = ?", user_id)
    await tx.c.execute("DELETE FROM offline_auth_users WHERE id = ?", user_id)
    return True
