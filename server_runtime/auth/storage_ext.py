"""Auth data of the second-factor, organization and passkey features, in the same stores as part one.

Rows: TOTP enrolments (the secret sealed with a key derived from AUTH_SECRET), recovery codes (SHA-256 of
80-bit random codes), one-time challenges (MFA sign-in tokens, passkey challenges, account-linking states;
all kept as hashes of their handles, single use, with an expiry), organizations, memberships, invites (token
hash), the active organization of each session, and passkeys (public keys only).

``ExtTx`` declares the operations; ``MemoryExtTx`` and ``SqlExtTx`` are mixins that ``storage``'s memory and
SQL transactions inherit, so one ``tx`` object serves every auth table. Tables are ``offline_auth_*`` too.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

__all__ = [
    "EXT_TABLES",
    "ChallengeRow",
    "ExtMemoryData",
    "ExtTx",
    "InviteRow",
    "Membership",
    "MemoryExtTx",
    "Org",
    "PasskeyRow",
    "SqlExtTx",
    "TotpRow",
]


@dataclass(frozen=True, slots=True)
class TotpRow:
    user_id: str
    sealed_secret: str  # AES-GCM sealed base32 secret (see totp.py)
    enabled_at: int | None  # None while the enrolment waits for its first code
    last_step: int  # time step of the last accepted code (-1: none); a code is accepted once
    created_at: int


@dataclass(frozen=True, slots=True)
class ChallengeRow:
    key_hash: str  # SHA-256 of the handle given to the client
    kind: str  # "mfa", "passkey-register", "passkey-auth", "link"
    user_id: str | None
    payload: str  # JSON text
    created_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class Org:
    id: str
    name: str
    created_by: str
    created_at: int


@dataclass(frozen=True, slots=True)
class Membership:
    org_id: str
    user_id: str
    role: str
    created_at: int


@dataclass(frozen=True, slots=True)
class InviteRow:
    token_hash: str
    org_id: str
    email: str
    role: str
    invited_by: str
    created_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class PasskeyRow:
    credential_id: str  # base64url, as WebAuthn's JSON forms carry it
    user_id: str
    public_key: str  # base64url of the COSE public key
    sign_count: int
    transports: str | None  # comma-separated hints for the browser
    created_at: int
    last_used_at: int | None = None


class ExtTx(abc.ABC):
    """Operations on the tables of this module (part of every ``AuthTx``)."""

    # -- TOTP and recovery codes
    @abc.abstractmethod
    async def totp(self, user_id: str) -> TotpRow | None: ...

    @abc.abstractmethod
    async def put_totp(self, row: TotpRow) -> None:
        """Insert or replace the user's enrolment."""

    @abc.abstractmethod
    async def advance_totp(self, user_id: str, step: int, enable_at: int | None) -> bool:
        """Record ``step`` as the last accepted code's step, only when it is newer than the stored one
        (False: the code was already used, or a concurrent request used it first). ``enable_at`` also
        marks a pending enrolment enabled."""

    @abc.abstractmethod
    async def delete_totp(self, user_id: str) -> None:
        """Remove the enrolment and every recovery code."""

    @abc.abstractmethod
    async def replace_recovery_codes(self, user_id: str, code_hashes: Sequence[str], now: int) -> None: ...

    @abc.abstractmethod
    async def use_recovery_code(self, user_id: str, code_hash: str, now: int) -> bool:
        """Spend an unused code; False when it is unknown or spent."""

    @abc.abstractmethod
    async def recovery_codes_left(self, user_id: str) -> int: ...

    # -- one-time challenges
    @abc.abstractmethod
    async def insert_challenge(self, row: ChallengeRow) -> None: ...

    @abc.abstractmethod
    async def challenge(self, key_hash: str) -> ChallengeRow | None:
        """Read without spending (MFA tokens survive a wrong code until they expire)."""

    @abc.abstractmethod
    async def take_challenge(self, key_hash: str) -> ChallengeRow | None:
        """Remove and return (single use: of concurrent takers, one gets the row)."""

    # -- organizations
    @abc.abstractmethod
    async def insert_org(self, org: Org) -> None: ...

    @abc.abstractmethod
    async def org(self, org_id: str) -> Org | None:
        """The organization; inside a PostgreSQL transaction its row stays locked, serializing changes to
        its memberships."""

    @abc.abstractmethod
    async def membership(self, org_id: str, user_id: str) -> Membership | None: ...

    @abc.abstractmethod
    async def user_orgs(self, user_id: str) -> list[tuple[Org, Membership]]:
        """The user's memberships with their organizations, oldest membership first."""

    @abc.abstractmethod
    async def org_members(self, org_id: str) -> list[tuple[Membership, str | None]]:
        """Memberships of an organization with each member's email, oldest first."""

    @abc.abstractmethod
    async def insert_membership(self, membership: Membership) -> bool:
        """False (nothing written) when the user is already a member."""

    @abc.abstractmethod
    async def set_role(self, org_id: str, user_id: str, role: str) -> bool: ...

    @abc.abstractmethod
    async def delete_membership(self, org_id: str, user_id: str) -> bool: ...

    @abc.abstractmethod
    async def insert_invite(self, row: InviteRow) -> None: ...

    @abc.abstractmethod
    async def take_invite(self, token_hash: str) -> InviteRow | None:
        """Remove and return a pending invite (single use)."""

    @abc.abstractmethod
    async def active_org(self, session_id: str) -> str | None: ...

    @abc.abstractmethod
    async def set_active_org(self, session_id: str, org_id: str | None) -> None: ...

    # -- passkeys
    @abc.abstractmethod
    async def insert_passkey(self, row: PasskeyRow) -> bool:
        """False (nothing written) when the credential id is already registered."""

    @abc.abstractmethod
    async def passkey(self, credential_id: str) -> PasskeyRow | None: ...

    @abc.abstractmethod
    async def user_passkeys(self, user_id: str) -> list[PasskeyRow]: ...

    @abc.abstractmethod
    async def record_passkey_use(self, credential_id: str, old_count: int, new_count: int, now: int) -> bool:
        """Store the new signature counter, only if it is still ``old_count`` (a concurrent use of the same
        assertion loses)."""

    @abc.abstractmethod
    async def delete_passkey(self, user_id: str, credential_id: str) -> bool: ...

    @abc.abstractmethod
    async def purge_ext(self, now: int) -> None:
        """Delete expired challenges and invites and active-organization rows of deleted sessions."""


# -- memory --------------------------------------------------------------------------------------------------


class ExtMemoryData:
    def __init__(self) -> None:
        self.totp: dict[str, TotpRow] = {}
        self.recovery: dict[tuple[str, str], int | None] = {}  # (user, hash) -> used_at
        self.challenges: dict[str, ChallengeRow] = {}
        self.orgs: dict[str, Org] = {}
        self.members: dict[tuple[str, str], Membership] = {}  # (org, user)
        self.invites: dict[str, InviteRow] = {}
        self.active: dict[str, str] = {}  # session -> org
        self.passkeys: dict[str, PasskeyRow] = {}


class MemoryExtTx(ExtTx):
    """The memory transaction's side of these tables (writes through its undo-logged ``_set``/``_delete``)."""

    x: ExtMemoryData

    # Provided by the memory transaction (storage._MemoryTx).
    def _set(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        raise NotImplementedError

    def _delete(self, table: dict[Any, Any], key: Any) -> None:
        raise NotImplementedError

    def _emails(self) -> dict[str, str | None]:
        """User id -> email."""
        raise NotImplementedError

    def _sessions(self) -> set[str]:
        """Ids of the sessions that still exist."""
        raise NotImplementedError

    async def totp(self, user_id: str) -> TotpRow | None:
        return self.x.totp.get(user_id)

    async def put_totp(self, row: TotpRow) -> None:
        self._set(self.x.totp, row.user_id, row)

    async def advance_totp(self, user_id: str, step: int, enable_at: int | None) -> bool:
        row = self.x.totp.get(user_id)
        if row is None or row.last_step >= step:
            return False
        enabled = row.enabled_at if row.enabled_at is not None else enable_at
        self._set(self.x.totp, user_id, replace(row, last_step=step, enabled_at=enabled))
        return True

    async def delete_totp(self, user_id: str) -> None:
        self._delete(self.x.totp, user_id)
        for key in [k for k in self.x.recovery if k[0] == user_id]:
            self._delete(self.x.recovery, key)

    async def replace_recovery_codes(self, user_id: str, code_hashes: Sequence[str], now: int) -> None:
        for key in [k for k in self.x.recovery if k[0] == user_id]:
            self._delete(self.x.recovery, key)
        for code_hash in code_hashes:
            self._set(self.x.recovery, (user_id, code_hash), None)

    async def use_recovery_code(self, user_id: str, code_hash: str, now: int) -> bool:
        key = (user_id, code_hash)
        if key not in self.x.recovery or self.x.recovery[key] is not None:
            return False
        self._set(self.x.recovery, key, now)
        return True

    async def recovery_codes_left(self, user_id: str) -> int:
        return sum(1 for (u, _), used in self.x.recovery.items() if u == user_id and used is None)

    async def insert_challenge(self, row: ChallengeRow) -> None:
        self._set(self.x.challenges, row.key_hash, row)

    async def challenge(self, key_hash: str) -> ChallengeRow | None:
        return self.x.challenges.get(key_hash)

    async def take_challenge(self, key_hash: str) -> ChallengeRow | None:
        row = self.x.challenges.get(key_hash)
        self._delete(self.x.challenges, key_hash)
        return row

    async def insert_org(self, org: Org) -> None:
        self._set(self.x.orgs, org.id, org)

    async def org(self, org_id: str) -> Org | None:
        return self.x.orgs.get(org_id)

    async def membership(self, org_id: str, user_id: str) -> Membership | None:
        return self.x.members.get((org_id, user_id))

    async def user_orgs(self, user_id: str) -> list[tuple[Org, Membership]]:
        found = sorted(
            (m for m in self.x.members.values() if m.user_id == user_id),
            key=lambda m: (m.created_at, m.org_id),
        )
        return [(self.x.orgs[m.org_id], m) for m in found if m.org_id in self.x.orgs]

    async def org_members(self, org_id: str) -> list[tuple[Membership, str | None]]:
        emails = self._emails()
        found = sorted(
            (m for m in self.x.members.values() if m.org_id == org_id),
            key=lambda m: (m.created_at, m.user_id),
        )
        return [(m, emails.get(m.user_id)) for m in found]

    async def insert_membership(self, membership: Membership) -> bool:
        key = (membership.org_id, membership.user_id)
        if key in self.x.members:
            return False
        self._set(self.x.members, key, membership)
        return True

    async def set_role(self, org_id: str, user_id: str, role: str) -> bool:
        found = self.x.members.get((org_id, user_id))
        if found is None:
            return False
        self._set(self.x.members, (org_id, user_id), replace(found, role=role))
        return True

    async def delete_membership(self, org_id: str, user_id: str) -> bool:
        if (org_id, user_id) not in self.x.members:
            return False
        self._delete(self.x.members, (org_id, user_id))
        return True

    async def insert_invite(self, row: InviteRow) -> None:
        self._set(self.x.invites, row.token_hash, row)

    async def take_invite(self, token_hash: str) -> InviteRow | None:
        row = self.x.invites.get(token_hash)
        self._delete(self.x.invites, token_hash)
        return row

    async def active_org(self, session_id: str) -> str | None:
        return self.x.active.get(session_id)

    async def set_active_org(self, session_id: str, org_id: str | None) -> None:
        if org_id is None:
            self._delete(self.x.active, session_id)
        else:
            self._set(self.x.active, session_id, org_id)

    async def insert_passkey(self, row: PasskeyRow) -> bool:
        if row.credential_id in self.x.passkeys:
            return False
        self._set(self.x.passkeys, row.credential_id, row)
        return True

    async def passkey(self, credential_id: str) -> PasskeyRow | None:
        return self.x.passkeys.get(credential_id)

    async def user_passkeys(self, user_id: str) -> list[PasskeyRow]:
        return sorted(
            (p for p in self.x.passkeys.values() if p.user_id == user_id), key=lambda p: p.created_at
        )

    async def record_passkey_use(self, credential_id: str, old_count: int, new_count: int, now: int) -> bool:
        row = self.x.passkeys.get(credential_id)
        if row is None or row.sign_count != old_count:
            return False
        self._set(self.x.passkeys, credential_id, replace(row, sign_count=new_count, last_used_at=now))
        return True

    async def delete_passkey(self, user_id: str, credential_id: str) -> bool:
        row = self.x.passkeys.get(credential_id)
        if row is None or row.user_id != user_id:
            return False
        self._delete(self.x.passkeys, credential_id)
        return True

    async def purge_ext(self, now: int) -> None:
        for key in [k for k, c in self.x.challenges.items() if c.expires_at < now]:
            self._delete(self.x.challenges, key)
        for key in [k for k, i in self.x.invites.items() if i.expires_at < now]:
            self._delete(self.x.invites, key)
        sessions = self._sessions()
        for key in [k for k in self.x.active if k not in sessions]:
            self._delete(self.x.active, key)


# -- SQL -----------------------------------------------------------------------------------------------------

EXT_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS offline_auth_totp (
        user_id TEXT PRIMARY KEY,
        sealed_secret TEXT NOT NULL,
        enabled_at BIGINT,
        last_step BIGINT NOT NULL,
        created_at BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_recovery_codes (
        user_id TEXT NOT NULL,
        code_hash TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        used_at BIGINT,
        PRIMARY KEY (user_id, code_hash)
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_challenges (
        key_hash TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        user_id TEXT,
        payload TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_orgs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_by TEXT NOT NULL,
        created_at BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_memberships (
        org_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        role TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (org_id, user_id)
    )""",
    "CREATE INDEX IF NOT EXISTS offline_auth_memberships_user ON offline_auth_memberships (user_id)",
    """CREATE TABLE IF NOT EXISTS offline_auth_invites (
        token_hash TEXT PRIMARY KEY,
        org_id TEXT NOT NULL,
        email TEXT NOT NULL,
        role TEXT NOT NULL,
        invited_by TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_active_orgs (
        session_id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_passkeys (
        credential_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        public_key TEXT NOT NULL,
        sign_count BIGINT NOT NULL,
        transports TEXT,
        created_at BIGINT NOT NULL,
        last_used_at BIGINT
    )""",
    "CREATE INDEX IF NOT EXISTS offline_auth_passkeys_user ON offline_auth_passkeys (user_id)",
)

_TOTP: Final = "user_id, sealed_secret, enabled_at, last_step, created_at"
_CHALLENGE: Final = "key_hash, kind, user_id, payload, created_at, expires_at"
_INVITE: Final = "token_hash, org_id, email, role, invited_by, created_at, expires_at"
_PASSKEY: Final = "credential_id, user_id, public_key, sign_count, transports, created_at, last_used_at"


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _totp(row: Sequence[Any]) -> TotpRow:
    return TotpRow(str(row[0]), str(row[1]), _opt_int(row[2]), int(row[3]), int(row[4]))


def _challenge(row: Sequence[Any]) -> ChallengeRow:
    return ChallengeRow(str(row[0]), str(row[1]), row[2], str(row[3]), int(row[4]), int(row[5]))


def _invite(row: Sequence[Any]) -> InviteRow:
    return InviteRow(
        str(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), int(row[5]), int(row[6])
    )


def _passkey(row: Sequence[Any]) -> PasskeyRow:
    return PasskeyRow(
        str(row[0]), str(row[1]), str(row[2]), int(row[3]), row[4], int(row[5]), _opt_int(row[6])
    )


class _Connection(Protocol):
    async def fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]: ...
    async def execute(self, sql: str, *args: Any) -> int: ...


class SqlExtTx(ExtTx):
    """The SQL transaction's side of these tables (SQLite and PostgreSQL share the statements)."""

    c: _Connection
    for_update: str  # " FOR UPDATE" inside PostgreSQL transactions, else ""

    def _writing(self) -> None:  # provided by the SQL transaction (storage._SqlTx)
        raise NotImplementedError

    async def _row(self, sql: str, *args: Any) -> Sequence[Any] | None:
        rows = await self.c.fetch(sql, *args)
        return rows[0] if rows else None

    async def _write(self, sql: str, *args: Any) -> int:
        self._writing()
        return await self.c.execute(sql, *args)

    async def totp(self, user_id: str) -> TotpRow | None:
        row = await self._row(f"SELECT {_TOTP} FROM offline_auth_totp WHERE user_id = ?", user_id)
        return None if row is None else _totp(row)

    async def put_totp(self, row: TotpRow) -> None:
        await self._write(
            f"INSERT INTO offline_auth_totp ({_TOTP}) VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE"
            " SET sealed_secret = excluded.sealed_secret, enabled_at = excluded.enabled_at,"
            " last_step = excluded.last_step, created_at = excluded.created_at",
            row.user_id,
            row.sealed_secret,
            row.enabled_at,
            row.last_step,
            row.created_at,
        )

    async def advance_totp(self, user_id: str, step: int, enable_at: int | None) -> bool:
        changed = await self._write(
            "UPDATE offline_auth_totp SET last_step = ?, enabled_at = COALESCE(enabled_at, ?)"
            " WHERE user_id = ? AND last_step < ?",
            step,
            enable_at,
            user_id,
            step,
        )
        return changed == 1

    async def delete_totp(self, user_id: str) -> None:
        await self._write("DELETE FROM offline_auth_totp WHERE user_id = ?", user_id)
        await self._write("DELETE FROM offline_auth_recovery_codes WHERE user_id = ?", user_id)

    async def replace_recovery_codes(self, user_id: str, code_hashes: Sequence[str], now: int) -> None:
        await self._write("DELETE FROM offline_auth_recovery_codes WHERE user_id = ?", user_id)
        for code_hash in code_hashes:
            await self._write(
                "INSERT INTO offline_auth_recovery_codes (user_id, code_hash, created_at) VALUES (?, ?, ?)",
                user_id,
                code_hash,
                now,
            )

    async def use_recovery_code(self, user_id: str, code_hash: str, now: int) -> bool:
        changed = await self._write(
            "UPDATE offline_auth_recovery_codes SET used_at = ?"
            " WHERE user_id = ? AND code_hash = ? AND used_at IS NULL",
            now,
            user_id,
            code_hash,
        )
        return changed == 1

    async def recovery_codes_left(self, user_id: str) -> int:
        rows = await self.c.fetch(
            "SELECT COUNT(*) FROM offline_auth_recovery_codes WHERE user_id = ? AND used_at IS NULL", user_id
        )
        return int(rows[0][0])

    async def insert_challenge(self, row: ChallengeRow) -> None:
        await self._write(
            f"INSERT INTO offline_auth_challenges ({_CHALLENGE}) VALUES (?, ?, ?, ?, ?, ?)",
            row.key_hash,
            row.kind,
            row.user_id,
            row.payload,
            row.created_at,
            row.expires_at,
        )

    async def challenge(self, key_hash: str) -> ChallengeRow | None:
        row = await self._row(
            f"SELECT {_CHALLENGE} FROM offline_auth_challenges WHERE key_hash = ?", key_hash
        )
        return None if row is None else _challenge(row)

    async def take_challenge(self, key_hash: str) -> ChallengeRow | None:
        row = await self._row(
            f"SELECT {_CHALLENGE} FROM offline_auth_challenges WHERE key_hash = ?" + self.for_update, key_hash
        )
        if row is None:
            return None
        deleted = await self._write("DELETE FROM offline_auth_challenges WHERE key_hash = ?", key_hash)
        return _challenge(row) if deleted == 1 else None

    async def insert_org(self, org: Org) -> None:
        await self._write(
            "INSERT INTO offline_auth_orgs (id, name, created_by, created_at) VALUES (?, ?, ?, ?)",
            org.id,
            org.name,
            org.created_by,
            org.created_at,
        )

    async def org(self, org_id: str) -> Org | None:
        row = await self._row(
            "SELECT id, name, created_by, created_at FROM offline_auth_orgs WHERE id = ?" + self.for_update,
            org_id,
        )
        return None if row is None else Org(str(row[0]), str(row[1]), str(row[2]), int(row[3]))

    async def membership(self, org_id: str, user_id: str) -> Membership | None:
        row = await self._row(
            "SELECT org_id, user_id, role, created_at FROM offline_auth_memberships"
            " WHERE org_id = ? AND user_id = ?",
            org_id,
            user_id,
        )
        return None if row is None else Membership(str(row[0]), str(row[1]), str(row[2]), int(row[3]))

    async def user_orgs(self, user_id: str) -> list[tuple[Org, Membership]]:
        rows = await self.c.fetch(
            "SELECT o.id, o.name, o.created_by, o.created_at, m.role, m.created_at"
            " FROM offline_auth_memberships m JOIN offline_auth_orgs o ON o.id = m.org_id"
            " WHERE m.user_id = ? ORDER BY m.created_at, m.org_id",
            user_id,
        )
        return [
            (
                Org(str(r[0]), str(r[1]), str(r[2]), int(r[3])),
                Membership(str(r[0]), user_id, str(r[4]), int(r[5])),
            )
            for r in rows
        ]

    async def org_members(self, org_id: str) -> list[tuple[Membership, str | None]]:
        rows = await self.c.fetch(
            "SELECT m.user_id, m.role, m.created_at, u.email FROM offline_auth_memberships m"
            " LEFT JOIN offline_auth_users u ON u.id = m.user_id"
            " WHERE m.org_id = ? ORDER BY m.created_at, m.user_id",
            org_id,
        )
        return [(Membership(org_id, str(r[0]), str(r[1]), int(r[2])), r[3]) for r in rows]

    async def insert_membership(self, membership: Membership) -> bool:
        changed = await self._write(
            "INSERT INTO offline_auth_memberships (org_id, user_id, role, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            membership.org_id,
            membership.user_id,
            membership.role,
            membership.created_at,
        )
        return changed == 1

    async def set_role(self, org_id: str, user_id: str, role: str) -> bool:
        changed = await self._write(
            "UPDATE offline_auth_memberships SET role = ? WHERE org_id = ? AND user_id = ?",
            role,
            org_id,
            user_id,
        )
        return changed == 1

    async def delete_membership(self, org_id: str, user_id: str) -> bool:
        changed = await self._write(
            "DELETE FROM offline_auth_memberships WHERE org_id = ? AND user_id = ?", org_id, user_id
        )
        return changed == 1

    async def insert_invite(self, row: InviteRow) -> None:
        await self._write(
            f"INSERT INTO offline_auth_invites ({_INVITE}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            row.token_hash,
            row.org_id,
            row.email,
            row.role,
            row.invited_by,
            row.created_at,
            row.expires_at,
        )

    async def take_invite(self, token_hash: str) -> InviteRow | None:
        row = await self._row(
            f"SELECT {_INVITE} FROM offline_auth_invites WHERE token_hash = ?" + self.for_update, token_hash
        )
        if row is None:
            return None
        deleted = await self._write("DELETE FROM offline_auth_invites WHERE token_hash = ?", token_hash)
        return _invite(row) if deleted == 1 else None

    async def active_org(self, session_id: str) -> str | None:
        row = await self._row("SELECT org_id FROM offline_auth_active_orgs WHERE session_id = ?", session_id)
        return None if row is None else str(row[0])

    async def set_active_org(self, session_id: str, org_id: str | None) -> None:
        if org_id is None:
            await self._write("DELETE FROM offline_auth_active_orgs WHERE session_id = ?", session_id)
            return
        await self._write(
            "INSERT INTO offline_auth_active_orgs (session_id, org_id) VALUES (?, ?)"
            " ON CONFLICT (session_id) DO UPDATE SET org_id = excluded.org_id",
            session_id,
            org_id,
        )

    async def insert_passkey(self, row: PasskeyRow) -> bool:
        changed = await self._write(
            f"INSERT INTO offline_auth_passkeys ({_PASSKEY}) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            row.credential_id,
            row.user_id,
            row.public_key,
            row.sign_count,
            row.transports,
            row.created_at,
            row.last_used_at,
        )
        return changed == 1

    async def passkey(self, credential_id: str) -> PasskeyRow | None:
        row = await self._row(
            f"SELECT {_PASSKEY} FROM offline_auth_passkeys WHERE credential_id = ?", credential_id
        )
        return None if row is None else _passkey(row)

    async def user_passkeys(self, user_id: str) -> list[PasskeyRow]:
        rows = await self.c.fetch(
            f"SELECT {_PASSKEY} FROM offline_auth_passkeys WHERE user_id = ? ORDER BY created_at", user_id
        )
        return [_passkey(r) for r in rows]

    async def record_passkey_use(self, credential_id: str, old_count: int, new_count: int, now: int) -> bool:
        changed = await self._write(
            "UPDATE offline_auth_passkeys SET sign_count = ?, last_used_at = ?"
            " WHERE credential_id = ? AND sign_count = ?",
            new_count,
            now,
            credential_id,
            old_count,
        )
        return changed == 1

    async def delete_passkey(self, user_id: str, credential_id: str) -> bool:
        changed = await self._write(
            "DELETE FROM offline_auth_passkeys WHERE credential_id = ? AND user_id = ?",
            credential_id,
            user_id,
        )
        return changed == 1

    async def purge_ext(self, now: int) -> None:
        await self._write("DELETE FROM offline_auth_challenges WHERE expires_at < ?", now)
        await self._write("DELETE FROM offline_auth_invites WHERE expires_at < ?", now)
        await self._write(
            "DELETE FROM offline_auth_active_orgs WHERE NOT EXISTS (SELECT 1 FROM offline_auth_sessions s"
            " WHERE s.id = offline_auth_active_orgs.session_id)"
        )
