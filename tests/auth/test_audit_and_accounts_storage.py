"""The audit log and the account administration tables in each server store (memory, SQLite, PostgreSQL):
entries recorded, filtered and paged newest first, bounded by count and age, stripped of anything secret;
users searched and paged, disabled and enabled, deleted with every auth row of theirs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from offline.core.errors import OfflineError
from server_runtime.auth import accounts
from server_runtime.auth.audit import (
    AuditLog,
    AuditQuery,
    AuditRetention,
    clean_detail,
)
from server_runtime.auth.settings import auth_options_from_environment
from server_runtime.auth.storage import Identity, RefreshRow, SessionRow, User
from server_runtime.auth.storage_ext import ChallengeRow, Membership, Org, PasskeyRow, TotpRow

from .conftest import SCHEMA, StoreFactory

DAY = 24 * 3600 * 1000


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_clean_detail_drops_whatever_may_be_secret() -> None:
    detail = clean_detail(
        {
            "email": "a@example.com",
            "password": "hunter2hunter2",
            "newPassword": "x",
            "refreshToken": "r",
            "code": "123456",
            "recoveryCode": "abcd",
            "tokenHash": "h",
            "apiKey": "k",
            "method": "password",
            "count": 3,
            "nested": {"password": "p"},
            "providers": ["google", 7],
            "long": "y" * 1000,
        }
    )
    assert detail == {
        "email": "a@example.com",
        "method": "password",
        "count": 3,
        "providers": ["google"],
        "long": "y" * 200,
    }


def test_audit_entries_are_filtered_paged_and_bounded(stores: StoreFactory) -> None:
    async def scenario() -> None:
        store = await stores.open()
        try:
            await store.set_schema(SCHEMA)
            clock = Clock()
            published: list[dict[str, Any]] = []
            audit = AuditLog(
                store.auth_store, retention=AuditRetention(max_entries=1000, max_age_days=1), now=clock
            )
            audit.listeners.append(published.append)
            first = await audit.record(
                "sign-in", actor="user:u1", subject="u1", address="10.0.0.1", detail={"password": "nope"}
            )
            assert first is not None and first.detail == {}
            clock.now += 1
            await audit.record("sign-in-failed", subject="u2", address="10.0.0.2", detail={"reason": "x"})
            clock.now += 1
            await audit.record("user-disabled", actor="admin", subject="u1")
            assert [e["kind"] for e in published] == ["sign-in", "sign-in-failed", "user-disabled"]
            assert published[0]["at"].endswith("Z") and published[0]["address"] == "10.0.0.1"

            everything = await audit.entries(AuditQuery())
            assert [e.kind for e in everything] == ["user-disabled", "sign-in-failed", "sign-in"]
            assert [e.kind for e in await audit.entries(AuditQuery(user="u1"))] == [
                "user-disabled",
                "sign-in",
            ]
            only = await audit.entries(AuditQuery(kinds=("sign-in", "sign-in-failed")))
            assert [e.kind for e in only] == ["sign-in-failed", "sign-in"]
            since = int((clock.now - 1) * 1000)
            assert [e.kind for e in await audit.entries(AuditQuery(since=since))] == [
                "user-disabled",
                "sign-in-failed",
            ]
            page = await audit.entries(AuditQuery(limit=2))
            rest = await audit.entries(AuditQuery(before=page[-1].id))
            assert [e.id for e in page + rest] == [e.id for e in everything]

            # Age: a day later the trim (on this process's 64th entry) drops the old ones.
            clock.now += 2 * 86400
            for i in range(64):
                await audit.record("sign-in", subject=f"n{i}")
            kept = await audit.entries(AuditQuery(limit=500))
            assert len(kept) == 64 and all(e.subject and e.subject.startswith("n") for e in kept)

            # Count: a log bounded at 10 entries holds at most 10 + the entries between two trims.
            small = AuditLog(store.auth_store, retention=AuditRetention(max_entries=10), now=clock)
            for i in range(200):
                await small.record("sign-out", subject=f"c{i}")
            kept = await small.entries(AuditQuery(limit=500))
            assert 10 <= len(kept) <= 10 + 64
            assert kept[0].subject == "c199"
        finally:
            await store.close()

    asyncio.run(scenario())


def test_users_are_found_disabled_and_deleted_with_their_auth_rows(stores: StoreFactory) -> None:
    async def scenario() -> None:
        store = await stores.open()
        try:
            await store.set_schema(SCHEMA)
            auth = store.auth_store()
            async with auth.transaction() as tx:
                for i, email in enumerate(
                    ["ann@example.com", "bob@example.com", "ann.b@other.org", "x%y@z.io"]
                ):
                    assert await tx.insert_user(User(f"u{i}", email, "$argon2id$h", 1000 + i))
                assert await tx.insert_user(User("u9", None, None, 2000))
                await tx.insert_identity(Identity("github", "gh-1", "u0", None, 1000))
                await tx.insert_session(SessionRow("s0", "u0", 1000))
                await tx.insert_session(SessionRow("s1", "u1", 1000))
                await tx.insert_refresh(RefreshRow("h0", "s0", "s0", "u0", 1000, 1000 + DAY))
                await tx.insert_refresh(RefreshRow("h1", "s1", "s1", "u1", 1000, 1000 + DAY))
                await tx.put_totp(TotpRow("u0", "sealed", 1000, -1, 1000))
                await tx.replace_recovery_codes("u0", ["c1", "c2"], 1000)
                await tx.insert_passkey(PasskeyRow("cred-0", "u0", "pk", 0, None, 1000))
                await tx.insert_org(Org("o1", "Org", "u0", 1000))
                await tx.insert_membership(Membership("o1", "u0", "owner", 1000))
                await tx.insert_membership(Membership("o1", "u1", "member", 1000))
                await tx.set_active_org("s0", "o1")
                await tx.insert_challenge(ChallengeRow("ch0", "mfa", "u0", "{}", 1000, 1000 + DAY))

            async with auth.reader() as tx:
                everyone = await accounts.find_users(tx, None, after=None, limit=10)
                assert [u.id for u, _ in everyone] == ["u0", "u1", "u2", "u3", "u9"]
                assert [u.id for u, _ in await accounts.find_users(tx, "ANN", after=None, limit=10)] == [
                    "u0",
                    "u2",
                ]
                assert [u.id for u, _ in await accounts.find_users(tx, "ann", after="u0", limit=10)] == ["u2"]
                assert [u.id for u, _ in await accounts.find_users(tx, "u9", after=None, limit=10)] == ["u9"]
                # LIKE wildcards in the query are plain characters.
                assert [u.id for u, _ in await accounts.find_users(tx, "%", after=None, limit=10)] == ["u3"]
                assert [u.id for u, _ in await accounts.find_users(tx, "_", after=None, limit=10)] == []
                assert len(await accounts.find_users(tx, None, after=None, limit=2)) == 2
                facts = await accounts.facts(tx, "u0")
                assert [s.id for s in facts.sessions] == ["s0"]
                assert facts.providers == ["github"] and facts.totp_enabled and facts.passkeys == 1
                assert facts.orgs == [("o1", "owner")]

            async with auth.transaction() as tx:
                assert await accounts.set_disabled(tx, accounts.DisabledRow("u1", 5000, "admin", "spam"))
                assert not await accounts.set_disabled(tx, accounts.DisabledRow("u1", 6000, "admin", None))
            async with auth.reader() as tx:
                assert await accounts.disabled(tx, "u1") == accounts.DisabledRow("u1", 5000, "admin", "spam")
                marks = {u.id: m for u, m in await accounts.find_users(tx, None, after=None, limit=10)}
                assert marks["u1"] is not None and marks["u0"] is None
            async with auth.transaction() as tx:
                assert await accounts.clear_disabled(tx, "u1")
                assert not await accounts.clear_disabled(tx, "u1")
                assert await accounts.set_disabled(tx, accounts.DisabledRow("u0", 5000, "admin", None))

            async with auth.transaction() as tx:
                assert await accounts.delete_user(tx, "u0")
                assert not await accounts.delete_user(tx, "u0")
            async with auth.reader() as tx:
                assert await tx.user_by_id("u0") is None
                assert await tx.user_by_email("ann@example.com") is None
                assert await tx.user_by_identity("github", "gh-1") is None
                assert await tx.session("s0") is None and await tx.refresh("h0") is None
                assert await tx.totp("u0") is None and await tx.recovery_codes_left("u0") == 0
                assert await tx.passkey("cred-0") is None
                assert await tx.membership("o1", "u0") is None and await tx.org("o1") is not None
                assert await tx.active_org("s0") is None and await tx.challenge("ch0") is None
                assert await accounts.disabled(tx, "u0") is None
                # The other users are untouched.
                assert await tx.session("s1") is not None and await tx.membership("o1", "u1") is not None
            async with auth.transaction() as tx:  # the email is free again
                assert await tx.insert_user(User("u10", "ann@example.com", None, 3000))
        finally:
            await store.close()

    asyncio.run(scenario())


def test_audit_retention_from_the_environment() -> None:
    assert "audit_retention" not in auth_options_from_environment({})
    options = auth_options_from_environment({"OFFLINE_AUDIT_MAX_ENTRIES": "500"})
    assert options["audit_retention"] == AuditRetention(max_entries=500)
    options = auth_options_from_environment({"OFFLINE_AUDIT_MAX_AGE_DAYS": "7.5"})
    assert options["audit_retention"] == AuditRetention(max_age_days=7.5)
    for name, value in (
        ("OFFLINE_AUDIT_MAX_ENTRIES", "0"),
        ("OFFLINE_AUDIT_MAX_ENTRIES", "1.5"),
        ("OFFLINE_AUDIT_MAX_AGE_DAYS", "forever"),
        ("OFFLINE_AUDIT_MAX_AGE_DAYS", "-1"),
    ):
        with pytest.raises(OfflineError) as refused:
            auth_options_from_environment({name: value})
        assert refused.value.context["field"] == name and name in refused.value.message
