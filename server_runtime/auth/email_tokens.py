"""One-time tokens sent by email (password reset, email verification): kept as hashes, single use, short-lived.

Table ``offline_auth_email_tokens`` (a dict in memory): the SHA-256 of the token, its purpose, the user and
the address it was sent to (a token sent to an address the account no longer has is void), and when it
expires. The functions work on the transactions of every store kind (like ``sessions``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .storage import AuthTx, _MemoryTx, _SqlTx

__all__ = [
    "EMAIL_TOKEN_TABLES",
    "PASSWORD_RESET",
    "VERIFY_EMAIL",
    "EmailTokenRow",
    "drop_user_tokens",
    "insert_token",
    "peek_token",
    "purge_tokens",
    "take_token",
]

PASSWORD_RESET: Final = "password-reset"
VERIFY_EMAIL: Final = "verify-email"

EMAIL_TOKEN_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS offline_auth_email_tokens (
        token_hash TEXT PRIMARY KEY,
        purpose TEXT NOT NULL,
        user_id TEXT NOT NULL,
        email TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS offline_auth_email_tokens_user ON offline_auth_email_tokens (user_id)",
)
_COLUMNS: Final = "token_hash, purpose, user_id, email, created_at, expires_at"


@dataclass(frozen=True, slots=True)
class EmailTokenRow:
    token_hash: str
    purpose: str
    user_id: str
    email: str
    created_at: int
    expires_at: int


def _row(values: Sequence[Any]) -> EmailTokenRow:
    return EmailTokenRow(
        str(values[0]), str(values[1]), str(values[2]), str(values[3]), int(values[4]), int(values[5])
    )


def _table(tx: _MemoryTx) -> dict[str, EmailTokenRow]:
    table: dict[str, EmailTokenRow] = tx.d.email_tokens
    return table


async def insert_token(tx: AuthTx, row: EmailTokenRow) -> None:
    if isinstance(tx, _MemoryTx):
        tx._set(_table(tx), row.token_hash, row)
        return
    assert isinstance(tx, _SqlTx)
    tx._writing()
    await tx.c.execute(
        f"INSERT INTO offline_auth_email_tokens ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        row.token_hash,
        row.purpose,
        row.user_id,
        row.email,
        row.created_at,
        row.expires_at,
    )


async def peek_token(tx: AuthTx, token_hash: str) -> EmailTokenRow | None:
    """The row, left in place (a check before the expensive part of a completion)."""
    if isinstance(tx, _MemoryTx):
        return _table(tx).get(token_hash)
    assert isinstance(tx, _SqlTx)
    rows = await tx.c.fetch(
        f"SELECT {_COLUMNS} FROM offline_auth_email_tokens WHERE token_hash = ?", token_hash
    )
    return _row(rows[0]) if rows else None


async def take_token(tx: AuthTx, token_hash: str) -> EmailTokenRow | None:
    """Remove and return the row: of concurrent takers, one gets it (single use)."""
    if isinstance(tx, _MemoryTx):
        row = _table(tx).get(token_hash)
        tx._delete(_table(tx), token_hash)
        return row
    assert isinstance(tx, _SqlTx)
    tx._writing()
    rows = await tx.c.fetch(
        f"SELECT {_COLUMNS} FROM offline_auth_email_tokens WHERE token_hash = ?" + tx.for_update, token_hash
    )
    if not rows:
        return None
    deleted = await tx.c.execute("DELETE FROM offline_auth_email_tokens WHERE token_hash = ?", token_hash)
    return _row(rows[0]) if deleted == 1 else None


async def drop_user_tokens(tx: AuthTx, user_id: str, purpose: str) -> int:
    """Delete every token of ``purpose`` the user still has (after one of them was used)."""
    if isinstance(tx, _MemoryTx):
        table = _table(tx)
        keys = [k for k, r in table.items() if r.user_id == user_id and r.purpose == purpose]
        for key in keys:
            tx._delete(table, key)
        return len(keys)
    assert isinstance(tx, _SqlTx)
    tx._writing()
    return await tx.c.execute(
        "DELETE FROM offline_auth_email_tokens WHERE user_id = ? AND purpose = ?", user_id, purpose
    )


async def purge_tokens(tx: AuthTx, now: int) -> None:
    """Delete expired tokens."""
    if isinstance(tx, _MemoryTx):
        table = _table(tx)
        for key in [k for k, r in table.items() if r.expires_at < now]:
            tx._delete(table, key)
        return
    assert isinstance(tx, _SqlTx)
    tx._writing()
    await tx.c.execute("DELETE FROM offline_auth_email_tokens WHERE expires_at < ?", now)
