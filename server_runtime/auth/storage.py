"""Where auth data lives: users, provider identities, sessions, refresh tokens and pending OAuth states
(and, through ``storage_ext``, TOTP enrolments, recovery codes, one-time challenges, organizations,
memberships, invites, active organizations and passkeys; ``accounts`` keeps disabled marks and ``audit`` the
audit log, each in its own module).

The data sits beside the sync data, in the server's own store (memory, SQLite or PostgreSQL), and shares its
connections: ``server_store.auth_store()`` gives the matching ``AuthStore``. Tables are created on first use
and named ``offline_auth_*``. Nothing secret is stored in clear: refresh tokens and OAuth states are kept as
SHA-256 hashes, passwords as argon2 hashes. (The PKCE verifier is kept as is: the server must send it to the
provider; it is useless without the authorization code, which the server never stores.)

Every change goes through ``async with auth_store.transaction() as tx``: exclusive and atomic (all or
nothing). ``async with auth_store.reader() as tx`` reads committed data without taking the write lock (the
sync handshake checks a session this way); calling a write method on a reader is a programming error.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from offline.core.errors import STORAGE_ERROR, OfflineError

from .storage_ext import EXT_TABLES, ExtMemoryData, ExtTx, MemoryExtTx, SqlExtTx

if TYPE_CHECKING:
    from ..stores.base import ServerStore
    from ..stores.memory import MemoryServerStore
    from ..stores.postgres import PostgresServerStore
    from ..stores.sqlite import SQLiteServerStore

__all__ = [
    "AuthStore",
    "AuthTx",
    "Identity",
    "OAuthStateRow",
    "RefreshRow",
    "SessionRow",
    "User",
    "auth_store_for",
]


@dataclass(frozen=True, slots=True)
class User:
    id: str
    email: str | None  # normalised (lower case); None for a provider account without an email
    password_hash: str | None  # None for an account created through a provider
    created_at: int  # epoch milliseconds


@dataclass(frozen=True, slots=True)
class Identity:
    provider: str
    subject: str
    user_id: str
    email: str | None
    created_at: int


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One signed-in device: its access tokens carry ``sid`` = ``id``; its refresh tokens form one family."""

    id: str
    user_id: str
    created_at: int
    revoked_at: int | None = None
    revoked_reason: str | None = None


@dataclass(frozen=True, slots=True)
class RefreshRow:
    token_hash: str
    family_id: str
    session_id: str
    user_id: str
    created_at: int
    expires_at: int
    used_at: int | None = None


@dataclass(frozen=True, slots=True)
class OAuthStateRow:
    state_hash: str
    provider: str
    code_verifier: str
    redirect_uri: str | None
    created_at: int
    expires_at: int


class AuthTx(ExtTx):
    """The operations of one transaction (or one reader). Rows are returned as frozen dataclasses. The
    operations on the MFA, organization and passkey tables are declared in ``storage_ext.ExtTx``."""

    @abc.abstractmethod
    async def user_by_id(self, user_id: str) -> User | None: ...

    @abc.abstractmethod
    async def user_by_email(self, email: str) -> User | None: ...

    @abc.abstractmethod
    async def user_by_identity(self, provider: str, subject: str) -> User | None: ...

    @abc.abstractmethod
    async def insert_user(self, user: User) -> bool:
        """False (nothing written) when another user has this email."""

    @abc.abstractmethod
    async def set_password_hash(self, user_id: str, password_hash: str) -> None: ...

    @abc.abstractmethod
    async def insert_identity(self, identity: Identity) -> bool:
        """False (nothing written) when the (provider, subject) pair is already linked."""

    @abc.abstractmethod
    async def insert_session(self, session: SessionRow) -> None: ...

    @abc.abstractmethod
    async def session(self, session_id: str) -> SessionRow | None: ...

    @abc.abstractmethod
    async def revoke_session(self, session_id: str, now: int, reason: str) -> bool:
        """Revoke one live session; False when it was unknown or already revoked."""

    @abc.abstractmethod
    async def revoke_user_sessions(self, user_id: str, now: int, reason: str) -> int:
        """Revoke every live session of a user; returns how many."""

    @abc.abstractmethod
    async def insert_refresh(self, row: RefreshRow) -> None: ...

    @abc.abstractmethod
    async def refresh(self, token_hash: str) -> RefreshRow | None:
        """The refresh token row; inside a transaction it stays locked until the end (no concurrent rotation)."""

    @abc.abstractmethod
    async def mark_refresh_used(self, token_hash: str, now: int) -> bool:
        """Mark an unused token used; False when it was already used (the caller lost a race: reuse)."""

    @abc.abstractmethod
    async def insert_oauth_state(self, row: OAuthStateRow) -> None: ...

    @abc.abstractmethod
    async def take_oauth_state(self, state_hash: str) -> OAuthStateRow | None:
        """Remove and return a pending state (single use)."""

    @abc.abstractmethod
    async def purge(self, now: int, keep_revoked_ms: int) -> None:
        """Delete rows that can no longer matter: expired refresh tokens and OAuth states, sessions revoked
        more than ``keep_revoked_ms`` ago, and sessions left without a refresh token (all expired: their last
        access token was issued when the newest one was, so it has expired too)."""


class AuthStore(abc.ABC):
    """Auth data of one server store. See the module docstring."""

    kind: str

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[AuthTx]:
        """Exclusive and atomic: everything done in the block is committed at exit, or nothing if it raises."""

    @abc.abstractmethod
    def reader(self) -> AbstractAsyncContextManager[AuthTx]:
        """Reads of committed data; does not wait for writers where the backend allows it."""


def auth_store_for(store: ServerStore) -> AuthStore:
    """The ``AuthStore`` sharing ``store``'s connections (use ``store.auth_store()``, which caches it)."""
    from ..stores.memory import MemoryServerStore
    from ..stores.postgres import PostgresServerStore
    from ..stores.sqlite import SQLiteServerStore

    if isinstance(store, MemoryServerStore):
        return MemoryAuthStore(store)
    if isinstance(store, SQLiteServerStore):
        return SQLiteAuthStore(store)
    if isinstance(store, PostgresServerStore):
        return PostgresAuthStore(store)
    raise OfflineError(
        f"the server store {type(store).__name__} cannot keep auth data; use MemoryServerStore, "
        "create_sqlite_server_store or create_relational_server_store, or override auth_store()",
        STORAGE_ERROR,
        {"store": type(store).__name__},
    )


def _closed_error(kind: str) -> OfflineError:
    return OfflineError(f"the {kind} server store is closed", STORAGE_ERROR, {"store": kind, "closed": True})


# -- memory ------------------------------------------------------------------------------------------------------


class _MemoryData(ExtMemoryData):
    def __init__(self) -> None:
        super().__init__()
        self.users: dict[str, User] = {}
        self.emails: dict[str, str] = {}  # email -> user id
        self.identities: dict[tuple[str, str], Identity] = {}
        self.sessions: dict[str, SessionRow] = {}
        self.refresh: dict[str, RefreshRow] = {}
        self.states: dict[str, OAuthStateRow] = {}
        # Rows of the modules that keep their own tables (kinds as those modules say): user id -> disabled
        # mark (accounts), entry id -> audit entry (audit), token hash -> row (email_tokens), user id ->
        # (address, verified at) (verified_emails).
        self.disabled: dict[str, Any] = {}
        self.audit: dict[str, Any] = {}
        self.email_tokens: dict[str, Any] = {}
        self.verified_emails: dict[str, Any] = {}


class _MemoryTx(MemoryExtTx, AuthTx):
    """Writes go straight to the shared dicts, each with an undo step, run in reverse if the block raises."""

    def __init__(self, data: _MemoryData, writable: bool) -> None:
        self.d = data
        self.x = data
        self.writable = writable
        self.undo: list[Callable[[], None]] = []

    def _set(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        if not self.writable:
            raise RuntimeError("an auth store reader cannot write")
        missing = object()
        old = table.get(key, missing)
        table[key] = value

        def restore() -> None:
            if old is missing:
                table.pop(key, None)
            else:
                table[key] = old

        self.undo.append(restore)

    def _delete(self, table: dict[Any, Any], key: Any) -> None:
        if not self.writable:
            raise RuntimeError("an auth store reader cannot write")
        if key in table:
            old = table[key]
            del table[key]
            self.undo.append(lambda: table.__setitem__(key, old))

    def _emails(self) -> dict[str, str | None]:
        return {user.id: user.email for user in self.d.users.values()}

    def _sessions(self) -> set[str]:
        return set(self.d.sessions)

    async def user_by_id(self, user_id: str) -> User | None:
        return self.d.users.get(user_id)

    async def user_by_email(self, email: str) -> User | None:
        user_id = self.d.emails.get(email)
        return None if user_id is None else self.d.users.get(user_id)

    async def user_by_identity(self, provider: str, subject: str) -> User | None:
        identity = self.d.identities.get((provider, subject))
        return None if identity is None else self.d.users.get(identity.user_id)

    async def insert_user(self, user: User) -> bool:
        if user.email is not None:
            if user.email in self.d.emails:
                return False
            self._set(self.d.emails, user.email, user.id)
        self._set(self.d.users, user.id, user)
        return True

    async def set_password_hash(self, user_id: str, password_hash: str) -> None:
        user = self.d.users.get(user_id)
        if user is not None:
            self._set(self.d.users, user_id, replace(user, password_hash=password_hash))

    async def insert_identity(self, identity: Identity) -> bool:
        key = (identity.provider, identity.subject)
        if key in self.d.identities:
            return False
        self._set(self.d.identities, key, identity)
        return True

    async def insert_session(self, session: SessionRow) -> None:
        self._set(self.d.sessions, session.id, session)

    async def session(self, session_id: str) -> SessionRow | None:
        return self.d.sessions.get(session_id)

    async def revoke_session(self, session_id: str, now: int, reason: str) -> bool:
        session = self.d.sessions.get(session_id)
        if session is None or session.revoked_at is not None:
            return False
        self._set(self.d.sessions, session_id, replace(session, revoked_at=now, revoked_reason=reason))
        return True

    async def revoke_user_sessions(self, user_id: str, now: int, reason: str) -> int:
        live = [s for s in self.d.sessions.values() if s.user_id == user_id and s.revoked_at is None]
        for session in live:
            self._set(self.d.sessions, session.id, replace(session, revoked_at=now, revoked_reason=reason))
        return len(live)

    async def insert_refresh(self, row: RefreshRow) -> None:
        self._set(self.d.refresh, row.token_hash, row)

    async def refresh(self, token_hash: str) -> RefreshRow | None:
        return self.d.refresh.get(token_hash)

    async def mark_refresh_used(self, token_hash: str, now: int) -> bool:
        row = self.d.refresh.get(token_hash)
        if row is None or row.used_at is not None:
            return False
        self._set(self.d.refresh, token_hash, replace(row, used_at=now))
        return True

    async def insert_oauth_state(self, row: OAuthStateRow) -> None:
        self._set(self.d.states, row.state_hash, row)

    async def take_oauth_state(self, state_hash: str) -> OAuthStateRow | None:
        row = self.d.states.get(state_hash)
        self._delete(self.d.states, state_hash)
        return row

    async def purge(self, now: int, keep_revoked_ms: int) -> None:
        for key in [k for k, r in self.d.refresh.items() if r.expires_at < now]:
            self._delete(self.d.refresh, key)
        for key in [k for k, s in self.d.states.items() if s.expires_at < now]:
            self._delete(self.d.states, key)
        cutoff = now - keep_revoked_ms
        refreshable = {r.session_id for r in self.d.refresh.values()}
        for key in [
            k
            for k, s in self.d.sessions.items()
            if (s.revoked_at is not None and s.revoked_at < cutoff) or k not in refreshable
        ]:
            self._delete(self.d.sessions, key)
        await self.purge_ext(now)


class MemoryAuthStore(AuthStore):
    """Auth data in this process (with ``MemoryServerStore``: development and tests; lost on restart)."""

    kind = "memory"

    def __init__(self, store: MemoryServerStore) -> None:
        self._store = store
        self._data = _MemoryData()
        self._lock = asyncio.Lock()

    def _check_open(self) -> None:
        if self._store.closed:
            raise _closed_error(self.kind)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AuthTx]:
        self._check_open()
        async with self._lock:
            tx = _MemoryTx(self._data, writable=True)
            try:
                yield tx
            except BaseException:
                for undo in reversed(tx.undo):
                    undo()
                raise

    def transaction(self) -> AbstractAsyncContextManager[AuthTx]:
        return self._transaction()

    @asynccontextmanager
    async def _reader(self) -> AsyncIterator[AuthTx]:
        self._check_open()
        yield _MemoryTx(self._data, writable=False)

    def reader(self) -> AbstractAsyncContextManager[AuthTx]:
        return self._reader()


# -- SQL (SQLite and PostgreSQL share the statements; only placeholders and locking differ) ----------------------

_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS offline_auth_users (
        id TEXT PRIMARY KEY,
        email TEXT UNIQUE,
        password_hash TEXT,
        created_at BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_identities (
        provider TEXT NOT NULL,
        subject TEXT NOT NULL,
        user_id TEXT NOT NULL,
        email TEXT,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (provider, subject)
    )""",
    """CREATE TABLE IF NOT EXISTS offline_auth_sessions (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        revoked_at BIGINT,
        revoked_reason TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS offline_auth_sessions_user ON offline_auth_sessions (user_id)",
    """CREATE TABLE IF NOT EXISTS offline_auth_refresh_tokens (
        token_hash TEXT PRIMARY KEY,
        family_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        used_at BIGINT
    )""",
    "CREATE INDEX IF NOT EXISTS offline_auth_refresh_tokens_session ON offline_auth_refresh_tokens (session_id)",
    """CREATE TABLE IF NOT EXISTS offline_auth_oauth_states (
        state_hash TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        code_verifier TEXT NOT NULL,
        redirect_uri TEXT,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    )""",
)

_USER_COLUMNS: Final = "id, email, password_hash, created_at"
_SESSION_COLUMNS: Final = "id, user_id, created_at, revoked_at, revoked_reason"
_REFRESH_COLUMNS: Final = "token_hash, family_id, session_id, user_id, created_at, expires_at, used_at"
_STATE_COLUMNS: Final = "state_hash, provider, code_verifier, redirect_uri, created_at, expires_at"


def _all_tables() -> tuple[str, ...]:
    """Every auth table's statements, with those of the modules that keep their own (imported here: they
    import this module)."""
    from .accounts import ACCOUNT_TABLES
    from .audit import AUDIT_TABLES
    from .email_tokens import EMAIL_TOKEN_TABLES
    from .verified_emails import VERIFIED_EMAIL_TABLES

    return (
        *_TABLES,
        *EXT_TABLES,
        *ACCOUNT_TABLES,
        *AUDIT_TABLES,
        *EMAIL_TOKEN_TABLES,
        *VERIFIED_EMAIL_TABLES,
    )


def _user(row: Sequence[Any]) -> User:
    return User(str(row[0]), row[1], row[2], int(row[3]))


def _session(row: Sequence[Any]) -> SessionRow:
    return SessionRow(str(row[0]), str(row[1]), int(row[2]), None if row[3] is None else int(row[3]), row[4])


def _refresh(row: Sequence[Any]) -> RefreshRow:
    return RefreshRow(
        str(row[0]),
        str(row[1]),
        str(row[2]),
        str(row[3]),
        int(row[4]),
        int(row[5]),
        None if row[6] is None else int(row[6]),
    )


def _state(row: Sequence[Any]) -> OAuthStateRow:
    return OAuthStateRow(str(row[0]), str(row[1]), str(row[2]), row[3], int(row[4]), int(row[5]))


def _scrubbed(exc: BaseException, args: Sequence[Any]) -> str:
    """The database's message without any of the statement's longer values (hashes, verifiers)."""
    text = str(exc)
    for value in args:
        if isinstance(value, str) and len(value) >= 16:
            text = text.replace(value, "***")
    return text[:300]


class _Conn(abc.ABC):
    """A connection as the SQL transaction sees it: fetch rows, execute and count the rows changed."""

    kind: str
    errors: tuple[type[BaseException], ...]

    @abc.abstractmethod
    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[Sequence[Any]]: ...

    @abc.abstractmethod
    async def _execute(self, sql: str, args: Sequence[Any]) -> int: ...

    async def fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        try:
            return await self._fetch(sql, args)
        except self.errors as exc:
            raise _storage_error(self.kind, exc, args) from exc

    async def execute(self, sql: str, *args: Any) -> int:
        try:
            return await self._execute(sql, args)
        except self.errors as exc:
            raise _storage_error(self.kind, exc, args) from exc


def _storage_error(kind: str, exc: BaseException, args: Sequence[Any] = ()) -> OfflineError:
    return OfflineError(
        f"{kind} store: reading or writing auth data failed: {type(exc).__name__}: {_scrubbed(exc, args)}",
        STORAGE_ERROR,
        {"store": kind, "action": "auth", "cause": type(exc).__name__},
    )


class _SqlTx(SqlExtTx, AuthTx):
    def __init__(self, conn: _Conn, *, writable: bool, lock_rows: bool) -> None:
        self.c = conn
        self.writable = writable
        self.for_update = " FOR UPDATE" if lock_rows else ""

    def _writing(self) -> None:
        if not self.writable:
            raise RuntimeError("an auth store reader cannot write")

    async def _one(self, sql: str, *args: Any) -> Sequence[Any] | None:
        rows = await self.c.fetch(sql, *args)
        return rows[0] if rows else None

    async def user_by_id(self, user_id: str) -> User | None:
        row = await self._one(f"SELECT {_USER_COLUMNS} FROM offline_auth_users WHERE id = ?", user_id)
        return None if row is None else _user(row)

    async def user_by_email(self, email: str) -> User | None:
        row = await self._one(f"SELECT {_USER_COLUMNS} FROM offline_auth_users WHERE email = ?", email)
        return None if row is None else _user(row)

    async def user_by_identity(self, provider: str, subject: str) -> User | None:
        row = await self._one(
            "SELECT u.id, u.email, u.password_hash, u.created_at FROM offline_auth_users u"
            " JOIN offline_auth_identities i ON i.user_id = u.id WHERE i.provider = ? AND i.subject = ?",
            provider,
            subject,
        )
        return None if row is None else _user(row)

    async def insert_user(self, user: User) -> bool:
        self._writing()
        changed = await self.c.execute(
            f"INSERT INTO offline_auth_users ({_USER_COLUMNS}) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            user.id,
            user.email,
            user.password_hash,
            user.created_at,
        )
        return changed == 1

    async def set_password_hash(self, user_id: str, password_hash: str) -> None:
        self._writing()
        await self.c.execute(
            "UPDATE offline_auth_users SET password_hash = ? WHERE id = ?", password_hash, user_id
        )

    async def insert_identity(self, identity: Identity) -> bool:
        self._writing()
        changed = await self.c.execute(
            "INSERT INTO offline_auth_identities (provider, subject, user_id, email, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            identity.provider,
            identity.subject,
            identity.user_id,
            identity.email,
            identity.created_at,
        )
        return changed == 1

    async def insert_session(self, session: SessionRow) -> None:
        self._writing()
        await self.c.execute(
            f"INSERT INTO offline_auth_sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
            session.id,
            session.user_id,
            session.created_at,
            session.revoked_at,
            session.revoked_reason,
        )

    async def session(self, session_id: str) -> SessionRow | None:
        row = await self._one(
            f"SELECT {_SESSION_COLUMNS} FROM offline_auth_sessions WHERE id = ?", session_id
        )
        return None if row is None else _session(row)

    async def revoke_session(self, session_id: str, now: int, reason: str) -> bool:
        self._writing()
        changed = await self.c.execute(
            "UPDATE offline_auth_sessions SET revoked_at = ?, revoked_reason = ?"
            " WHERE id = ? AND revoked_at IS NULL",
            now,
            reason,
            session_id,
        )
        return changed > 0

    async def revoke_user_sessions(self, user_id: str, now: int, reason: str) -> int:
        self._writing()
        return await self.c.execute(
            "UPDATE offline_auth_sessions SET revoked_at = ?, revoked_reason = ?"
            " WHERE user_id = ? AND revoked_at IS NULL",
            now,
            reason,
            user_id,
        )

    async def insert_refresh(self, row: RefreshRow) -> None:
        self._writing()
        await self.c.execute(
            f"INSERT INTO offline_auth_refresh_tokens ({_REFRESH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            row.token_hash,
            row.family_id,
            row.session_id,
            row.user_id,
            row.created_at,
            row.expires_at,
            row.used_at,
        )

    async def refresh(self, token_hash: str) -> RefreshRow | None:
        row = await self._one(
            f"SELECT {_REFRESH_COLUMNS} FROM offline_auth_refresh_tokens WHERE token_hash = ?"
            + self.for_update,
            token_hash,
        )
        return None if row is None else _refresh(row)

    async def mark_refresh_used(self, token_hash: str, now: int) -> bool:
        self._writing()
        changed = await self.c.execute(
            "UPDATE offline_auth_refresh_tokens SET used_at = ? WHERE token_hash = ? AND used_at IS NULL",
            now,
            token_hash,
        )
        return changed == 1

    async def insert_oauth_state(self, row: OAuthStateRow) -> None:
        self._writing()
        await self.c.execute(
            f"INSERT INTO offline_auth_oauth_states ({_STATE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            row.state_hash,
            row.provider,
            row.code_verifier,
            row.redirect_uri,
            row.created_at,
            row.expires_at,
        )

    async def take_oauth_state(self, state_hash: str) -> OAuthStateRow | None:
        self._writing()
        row = await self._one(
            f"SELECT {_STATE_COLUMNS} FROM offline_auth_oauth_states WHERE state_hash = ?" + self.for_update,
            state_hash,
        )
        if row is None:
            return None
        # Only the transaction that deletes the row gets it: a state is good for one callback.
        deleted = await self.c.execute(
            "DELETE FROM offline_auth_oauth_states WHERE state_hash = ?", state_hash
        )
        return _state(row) if deleted == 1 else None

    async def purge(self, now: int, keep_revoked_ms: int) -> None:
        self._writing()
        await self.c.execute("DELETE FROM offline_auth_refresh_tokens WHERE expires_at < ?", now)
        await self.c.execute("DELETE FROM offline_auth_oauth_states WHERE expires_at < ?", now)
        await self.c.execute(
            "DELETE FROM offline_auth_sessions WHERE (revoked_at IS NOT NULL AND revoked_at < ?)"
            " OR NOT EXISTS (SELECT 1 FROM offline_auth_refresh_tokens r"
            " WHERE r.session_id = offline_auth_sessions.id)",
            now - keep_revoked_ms,
        )
        await self.purge_ext(now)


# -- SQLite --------------------------------------------------------------------------------------------------------


class _SQLiteConn(_Conn):
    kind = "sqlite"
    errors = (sqlite3.Error, OSError, ValueError)  # aiosqlite: ValueError for a closed connection

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[Sequence[Any]]:
        return list(await self.conn.execute_fetchall(sql, tuple(args)))

    async def _execute(self, sql: str, args: Sequence[Any]) -> int:
        cursor = await self.conn.execute(sql, tuple(args))
        try:
            return int(cursor.rowcount)
        finally:
            await cursor.close()


class SQLiteAuthStore(AuthStore):
    """Auth tables in the server's SQLite file. Writes run inside the server store's own writer (one write
    lock, one ``BEGIN IMMEDIATE`` transaction); reads use its read-only connection."""

    kind = "sqlite"

    def __init__(self, store: SQLiteServerStore) -> None:
        self._store = store
        self._ready = False
        self._ready_lock = asyncio.Lock()

    @asynccontextmanager
    async def _write_conn(self) -> AsyncIterator[_SQLiteConn]:
        # The store's writer holds its write lock and a BEGIN IMMEDIATE transaction on its write connection
        # for the whole block, and commits or rolls back at the end; auth statements run on that connection.
        async with self._store.writer():
            conn = self._store._writer_conn
            assert conn is not None
            yield _SQLiteConn(conn)

    async def _ensure_tables(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            async with self._write_conn() as conn:
                for statement in _all_tables():
                    await conn.execute(statement)
            self._ready = True

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AuthTx]:
        await self._ensure_tables()
        async with self._write_conn() as conn:
            yield _SqlTx(conn, writable=True, lock_rows=False)  # BEGIN IMMEDIATE already excludes writers

    def transaction(self) -> AbstractAsyncContextManager[AuthTx]:
        return self._transaction()

    @asynccontextmanager
    async def _reader(self) -> AsyncIterator[AuthTx]:
        await self._ensure_tables()
        # The server store's read-only connection: sees committed data, never waits for a writer.
        async with self._store._reading("reading auth data") as conn:
            yield _SqlTx(_SQLiteConn(conn), writable=False, lock_rows=False)

    def reader(self) -> AbstractAsyncContextManager[AuthTx]:
        return self._reader()


# -- PostgreSQL --------------------------------------------------------------------------------------------------


def _numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1, $2, ...`` (no statement here has a literal question mark)."""
    parts = sql.split("?")
    return "".join(part + (f"${i}" if i < len(parts) else "") for i, part in enumerate(parts, start=1))


class _PostgresConn(_Conn):
    kind = "postgresql"

    def __init__(self, conn: Any, errors: tuple[type[BaseException], ...]) -> None:
        self.conn = conn
        self.errors = errors

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[Sequence[Any]]:
        return list(await self.conn.fetch(_numbered(sql), *args))

    async def _execute(self, sql: str, args: Sequence[Any]) -> int:
        status = await self.conn.execute(_numbered(sql), *args)
        # asyncpg answers with the command tag, e.g. "UPDATE 3" or "INSERT 0 1": the count comes last.
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0


class PostgresAuthStore(AuthStore):
    """Auth tables in the server's PostgreSQL schema, on its connection pool. Transactions lock the rows
    they change (``SELECT ... FOR UPDATE``), so server processes sharing the database agree."""

    kind = "postgresql"

    def __init__(self, store: PostgresServerStore) -> None:
        from ..stores.postgres import _DB_ERRORS

        self._store = store
        self._errors: tuple[type[BaseException], ...] = tuple(_DB_ERRORS)
        self._ready = False
        self._ready_lock = asyncio.Lock()

    @asynccontextmanager
    async def _connection(self, *, transaction: bool) -> AsyncIterator[_PostgresConn]:
        store = self._store
        if store.closed:
            raise _closed_error(self.kind)
        try:
            async with contextlib.AsyncExitStack() as stack:
                raw = await stack.enter_async_context(store._pool.acquire())
                if transaction:
                    await stack.enter_async_context(raw.transaction())
                yield _PostgresConn(raw, self._errors)
        except self._errors as exc:  # acquiring, beginning or committing (statements wrap their own)
            raise _storage_error(self.kind, exc) from exc

    async def _ensure_tables(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            await self._store._prepare()  # the sync tables first (and a closed store fails here)
            async with self._connection(transaction=True) as conn:
                # Processes starting together must not race on CREATE TABLE IF NOT EXISTS.
                await conn.fetch("SELECT pg_advisory_xact_lock(?)", self._store.lock_key ^ 0x61757468)
                for statement in _all_tables():
                    await conn.execute(statement)
            self._ready = True

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AuthTx]:
        await self._ensure_tables()
        async with self._connection(transaction=True) as conn:
            yield _SqlTx(conn, writable=True, lock_rows=True)

    def transaction(self) -> AbstractAsyncContextManager[AuthTx]:
        return self._transaction()

    @asynccontextmanager
    async def _reader(self) -> AsyncIterator[AuthTx]:
        await self._ensure_tables()
        async with self._connection(transaction=False) as conn:
            yield _SqlTx(conn, writable=False, lock_rows=False)

    def reader(self) -> AbstractAsyncContextManager[AuthTx]:
        return self._reader()
