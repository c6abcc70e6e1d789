"""The part-two auth tables in each server store (memory, SQLite, PostgreSQL): TOTP steps that only move
forward, recovery codes and challenges used once, organizations and memberships, invites, the active
organization per session, passkey counters (compare-and-set), rollback and purging."""

from __future__ import annotations

import asyncio

import pytest

from server_runtime.auth.storage import SessionRow, User
from server_runtime.auth.storage_ext import ChallengeRow, InviteRow, Membership, Org, PasskeyRow, TotpRow

from .conftest import SCHEMA, StoreFactory


class Boom(Exception):
    pass


def test_part_two_tables(stores: StoreFactory) -> None:
    async def scenario() -> None:
        store = await stores.open()
        try:
            await store.set_schema(SCHEMA)
            auth = store.auth_store()
            async with auth.transaction() as tx:
                for user_id, email in (("u1", "a@example.com"), ("u2", "b@example.com")):
                    assert await tx.insert_user(User(user_id, email, None, 1000))
                await tx.insert_session(SessionRow("s1", "u1", 1000))
                # TOTP: a pending enrolment, enabled by the first accepted step; steps only move forward.
                await tx.put_totp(TotpRow("u1", "v1:sealed", None, -1, 1000))
                assert await tx.advance_totp("u1", 50, 1100)
                assert not await tx.advance_totp("u1", 50, 1200)  # the same step again: a replay
                assert not await tx.advance_totp("u1", 49, 1200)
                assert await tx.advance_totp("u1", 51, 1300)
                await tx.replace_recovery_codes("u1", ["r1", "r2"], 1100)
                await tx.insert_challenge(ChallengeRow("c1", "mfa", "u1", "{}", 1000, 5000))
                await tx.insert_challenge(ChallengeRow("c2", "link", "u1", "{}", 1000, 1500))
                await tx.insert_org(Org("o1", "Acme", "u1", 1000))
                assert await tx.insert_membership(Membership("o1", "u1", "owner", 1000))
                assert await tx.insert_membership(Membership("o1", "u2", "member", 1001))
                assert not await tx.insert_membership(Membership("o1", "u2", "admin", 1002))
                await tx.insert_invite(InviteRow("i1", "o1", "c@example.com", "member", "u1", 1000, 9000))
                await tx.insert_invite(InviteRow("i2", "o1", "d@example.com", "member", "u1", 1000, 1500))
                await tx.set_active_org("s1", "o1")
                await tx.set_active_org("gone-session", "o1")
                assert await tx.insert_passkey(PasskeyRow("k1", "u1", "pub", 0, "internal", 1000))
                assert not await tx.insert_passkey(PasskeyRow("k1", "u2", "other", 0, None, 1001))

            with pytest.raises(Boom):
                async with auth.transaction() as tx:
                    assert await tx.use_recovery_code("u1", "r1", 2000)
                    assert await tx.take_challenge("c1") is not None
                    assert await tx.set_role("o1", "u2", "admin")
                    assert await tx.delete_membership("o1", "u1")
                    assert await tx.take_invite("i1") is not None
                    await tx.set_active_org("s1", None)
                    assert await tx.record_passkey_use("k1", 0, 5, 2000)
                    await tx.delete_totp("u1")
                    raise Boom()

            async with auth.reader() as tx:  # all of it rolled back
                assert await tx.totp("u1") == TotpRow("u1", "v1:sealed", 1100, 51, 1000)
                assert await tx.recovery_codes_left("u1") == 2
                assert await tx.challenge("c1") == ChallengeRow("c1", "mfa", "u1", "{}", 1000, 5000)
                assert await tx.org("o1") == Org("o1", "Acme", "u1", 1000)
                assert [(o.id, m.role) for o, m in await tx.user_orgs("u2")] == [("o1", "member")]
                assert [(m.user_id, m.role, email) for m, email in await tx.org_members("o1")] == [
                    ("u1", "owner", "a@example.com"),
                    ("u2", "member", "b@example.com"),
                ]
                assert await tx.active_org("s1") == "o1"
                assert await tx.passkey("k1") == PasskeyRow("k1", "u1", "pub", 0, "internal", 1000)
                assert [p.credential_id for p in await tx.user_passkeys("u1")] == ["k1"]
                with pytest.raises(RuntimeError, match="cannot write"):
                    await tx.set_active_org("s1", None)

            async with auth.transaction() as tx:
                assert await tx.use_recovery_code("u1", "r1", 2000)
                assert not await tx.use_recovery_code("u1", "r1", 2001)
                assert not await tx.use_recovery_code("u2", "r2", 2001)  # another user's code
                assert await tx.recovery_codes_left("u1") == 1
                assert await tx.take_challenge("c1") is not None
                assert await tx.take_challenge("c1") is None
                assert (await tx.take_invite("i1")) == InviteRow(
                    "i1", "o1", "c@example.com", "member", "u1", 1000, 9000
                )
                assert await tx.take_invite("i1") is None
                assert await tx.set_role("o1", "u2", "admin")
                assert (await tx.membership("o1", "u2")) == Membership("o1", "u2", "admin", 1001)
                assert not await tx.set_role("o1", "nobody", "admin")
                await tx.set_active_org("s1", "o2")  # an upsert
                assert await tx.active_org("s1") == "o2"
                assert await tx.record_passkey_use("k1", 0, 5, 2000)
                assert not await tx.record_passkey_use("k1", 0, 6, 2001)  # the counter moved meanwhile
                assert not await tx.delete_passkey("u2", "k1")  # not u2's passkey
                assert (await tx.passkey("k1")) == PasskeyRow("k1", "u1", "pub", 5, "internal", 1000, 2000)
                await tx.purge(3000, keep_revoked_ms=0)

            async with auth.reader() as tx:
                assert await tx.challenge("c2") is None  # expired at 1500
                assert await tx.active_org("gone-session") is None  # its session never existed
            async with auth.transaction() as tx:
                assert await tx.take_invite("i2") is None  # expired and purged
                assert await tx.delete_membership("o1", "u2")
                assert not await tx.delete_membership("o1", "u2")
                assert await tx.delete_passkey("u1", "k1")
                await tx.delete_totp("u1")
                assert await tx.totp("u1") is None and await tx.recovery_codes_left("u1") == 0
        finally:
            await store.close()

    asyncio.run(scenario())
