"""Which address of each account was verified: ``offline_auth_verified_emails`` (a dict in memory).

One row per user: the address proved (by a verification link, a completed password reset, or an OAuth
provider that says so) and when. An account's email is verified when its current address is the one in its
row, so changing the address makes it unverified until the new one is proved: nothing needs resetting.
"""

from __future__ import annotations

from typing import Final

from .storage import AuthTx, User, _MemoryTx, _SqlTx

__all__ = ["VERIFIED_EMAIL_TABLES", "is_verified", "mark_verified", "verified_email"]

VERIFIED_EMAIL_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS offline_auth_verified_emails (
        user_id TEXT PRIMARY KEY,
        email TEXT NOT NULL,
        verified_at BIGINT NOT NULL
    )""",
)


async def mark_verified(tx: AuthTx, user_id: str, email: str, now: int) -> None:
    if isinstance(tx, _MemoryTx):
        table: dict[str, tuple[str, int]] = tx.d.verified_emails
        tx._set(table, user_id, (email, now))
        return
    assert isinstance(tx, _SqlTx)
    tx._writing()
    await tx.c.execute(
        "INSERT INTO offline_auth_verified_emails (user_id, email, verified_at) VALUES (?, ?, ?)"
        " ON CONFLICT (user_id) DO UPDATE SET email = excluded.email, verified_at = excluded.verified_at",
        user_id,
        email,
        now,
    )


async def verified_email(tx: AuthTx, user_id: str) -> str | None:
    """The address last verified for the user (which may no longer be theirs)."""
    if isinstance(tx, _MemoryTx):
        found: tuple[str, int] | None = tx.d.verified_emails.get(user_id)
        return None if found is None else found[0]
    assert isinstance(tx, _SqlTx)
    rows = await tx.c.fetch("SELECT email FROM offline_auth_verified_emails WHERE user_id = ?", user_id)
    return str(rows[0][0]) if rows else None


async def is_verified(tx: AuthTx, user: User) -> bool:
    """Whether the user's current address is verified (an account without an address is not)."""
    return user.email is not None and await verified_email(tx, user.id) == user.email
