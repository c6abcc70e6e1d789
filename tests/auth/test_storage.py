"""The auth tables in each server store (memory, SQLite, PostgreSQL): atomic transactions, single-use OAuth
states, conditional refresh-token use, purging, and sharing the store's connections."""

from __future__ import annotations

import asyncio

import pytest

from offline.core.errors import OfflineError
from server_runtime.auth.storage import Identity, OAuthStateRow, RefreshRow, SessionRow, User

from .conftest import SCHEMA, StoreFactory

DAY = 24 * 3600 * 1000


class Boom(Exception):
    pass


def test_auth_store_transactions(stores: StoreFactory) -> None:
    async def scenario() -> None:
        store = await stores.open()
        try:
            await store.set_schema(SCHEMA)
            auth = store.auth_store()
            assert store.auth_store() is auth  # one per server store
            assert auth.kind == store.kind

            async with auth.transaction() as tx:
                assert await tx.insert_user(User("u1", "a@example.com", "$argon2id$x", 1000))
                assert not await tx.insert_user(User("u2", "a@example.com", None, 1001))  # email taken
                assert await tx.insert_user(User("u3", None, None, 1002))
                assert await tx.insert_user(User("u4", None, None, 1003))  # several users without email
                assert await tx.insert_identity(Identity("p", "sub-1", "u3", None, 1002))
                assert not await tx.insert_identity(Identity("p", "sub-1", "u4", None, 1003))
                await tx.insert_session(SessionRow("s1", "u1", 1000))
                await tx.insert_refresh(RefreshRow("h1", "s1", "s1", "u1", 1000, 1000 + DAY))

            # Everything in a block that raises is rolled back.
            with pytest.raises(Boom):
                async with auth.transaction() as tx:
                    assert await tx.insert_user(User("u5", "b@example.com", None, 2000))
                    await tx.set_password_hash("u1", "$argon2id$changed")
                    assert await tx.revoke_session("s1", 2000, "test")
                    assert await tx.mark_refresh_used("h1", 2000)
                    raise Boom()
            async with auth.reader() as tx:
                assert await tx.user_by_email("b@example.com") is None
                assert await tx.user_by_id("u1") == User("u1", "a@example.com", "$argon2id$x", 1000)
                assert await tx.session("s1") == SessionRow("s1", "u1", 1000)
                assert (await tx.refresh("h1")) == RefreshRow("h1", "s1", "s1", "u1", 1000, 1000 + DAY)
                found = await tx.user_by_identity("p", "sub-1")
                assert found is not None and found.id == "u3"
                with pytest.raises(RuntimeError, match="cannot write"):
                    await tx.revoke_session("s1", 1, "readers do not write")

            async with auth.transaction() as tx:
                assert await tx.mark_refresh_used("h1", 3000)
                assert not await tx.mark_refresh_used("h1", 3001)  # a token is used once
                await tx.insert_session(SessionRow("s2", "u1", 3000))
                await tx.insert_refresh(RefreshRow("h2", "s2", "s2", "u1", 3000, 3000 + DAY))
                assert await tx.revoke_user_sessions("u1", 4000, "all") == 2
                assert not await tx.revoke_session("s1", 4001, "again")
                await tx.insert_oauth_state(OAuthStateRow("st", "p", "verifier", "https://x/cb", 4000, 9000))
            async with auth.transaction() as tx:
                assert await tx.take_oauth_state("st") == OAuthStateRow(
                    "st", "p", "verifier", "https://x/cb", 4000, 9000
                )
                assert await tx.take_oauth_state("st") is None  # single use
            async with auth.reader() as tx:
                session = await tx.session("s1")
                assert session is not None and session.revoked_at == 4000 and session.revoked_reason == "all"

            # Purge: expired refresh tokens and states, long-revoked sessions, sessions with no refresh left.
            async with auth.transaction() as tx:
                await tx.insert_session(SessionRow("s3", "u3", 5000))
                await tx.insert_refresh(RefreshRow("h3", "s3", "s3", "u3", 5000, 5000 + 2 * DAY))
                await tx.insert_session(SessionRow("s4", "u3", 5000))
                await tx.insert_refresh(RefreshRow("h4", "s4", "s4", "u3", 5000, 6000))
                await tx.insert_oauth_state(OAuthStateRow("old", "p", "v", None, 5000, 6000))
                await tx.purge(5000 + DAY, keep_revoked_ms=1000)
            async with auth.reader() as tx:
                assert await tx.session("s1") is None and await tx.session("s2") is None  # revoked long ago
                assert await tx.refresh("h1") is None  # expired
                assert await tx.session("s3") is not None and await tx.refresh("h3") is not None
                assert await tx.session("s4") is None and await tx.refresh("h4") is None
            async with auth.transaction() as tx:
                assert await tx.take_oauth_state("old") is None
        finally:
            await store.close()

    asyncio.run(scenario())


def test_concurrent_transactions_use_a_refresh_token_once(stores: StoreFactory) -> None:
    async def scenario() -> None:
        store = await stores.open()
        try:
            await store.set_schema(SCHEMA)
            auth = store.auth_store()
            async with auth.transaction() as tx:
                await tx.insert_user(User("u1", None, None, 1))
                await tx.insert_session(SessionRow("s1", "u1", 1))
                await tx.insert_refresh(RefreshRow("h1", "s1", "s1", "u1", 1, 10**15))

            async def use() -> bool:
                async with auth.transaction() as tx:
                    row = await tx.refresh("h1")
                    assert row is not None
                    await asyncio.sleep(0)  # let the others interleave where the backend allows it
                    return row.used_at is None and await tx.mark_refresh_used("h1", 2)

            assert sorted(await asyncio.gather(*(use() for _ in range(5)))) == [False] * 4 + [True]
        finally:
            await store.close()

    asyncio.run(scenario())


def test_closed_store_refuses_auth_work(stores: StoreFactory) -> None:
    async def scenario() -> None:
        store = await stores.open()
        await store.set_schema(SCHEMA)
        auth = store.auth_store()
        await store.close()
        with pytest.raises(OfflineError) as caught:
            async with auth.reader() as tx:
                await tx.user_by_id("u1")
        assert caught.value.code == "STORAGE_ERROR"

    asyncio.run(scenario())
