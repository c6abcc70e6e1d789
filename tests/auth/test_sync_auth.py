"""Sync with the auth provider on a live server: scopes from the token's claims (``ownerId`` <- ``userId`` <-
``sub``, SPEC 4.4), refusals at the handshake (AUTH_FAILED), and a server without a provider (SPEC 5.2.1).

Clients are real ``create_app`` instances over WebSocket; their auth client is the smallest object the sync
engine accepts (``get_access_token()``), holding a token obtained from the server's /auth routes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect as ws_connect

from offline import OfflineError, create_app
from offline.core.uuid7 import generate_uuid_v7
from offline.store import App
from offline.store.database import REJECTED
from offline.sync import protocol as p
from server_runtime import MemoryServerStore
from server_runtime.auth import AuthRoutes
from tests.support.servers import ServerProcess, write_entry

from .conftest import (
    FAST_HASHER,
    OTHER_SECRET,
    SCHEMA,
    SECRET,
    StoreFactory,
    http,
    make_routes,
    serve,
    sign_up,
    sync_url,
)

FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 2.0, "handshake_timeout": 10.0}
TIMEOUT = 30.0


class TokenClient:
    """An auth client as the sync engine sees it: something that hands out the current access token."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    async def get_access_token(self) -> str | None:
        return self.token


def app_for(tmp_path: Path, name: str, url: str, token: str | None, **options: Any) -> App:
    sync = {"url": url, "auth_client": TokenClient(token), **FAST, **options}
    return create_app(SCHEMA, sync=sync, path=str(tmp_path / f"{name}.db"))


async def close_all(*apps: App) -> None:
    for app in apps:
        with contextlib.suppress(Exception):
            await app.sync.disconnect()
        app.close()


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def touched_records(app: App) -> set[str]:
    """Ids of every record any operation in the app's log is about (rejected ones aside)."""
    with app.db.lock:
        rows = app.db.conn.execute("SELECT record_id FROM _offline_ops WHERE status != ?", (REJECTED,))
        return {str(row[0]) for row in rows}


async def handshake(url: str, token: str | None) -> tuple[p.Message, int | None]:
    """Send a bare handshake; the server's first answer and the close code (None while still open)."""
    async with ws_connect(url) as ws:
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=generate_uuid_v7(),
            version_vector={},
            schema_version=SCHEMA.version,
            last_delivery_sequence=0,
            auth_token=token,
        )
        await ws.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(ws.recv(), 10))
        if isinstance(reply, p.ErrorMessage):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.recv(), 5)
        return reply, ws.close_code


def assert_auth_failed(reply: p.Message, close_code: int | None, what: str = "") -> None:
    assert isinstance(reply, p.ErrorMessage), (what, reply)
    assert reply.code == "AUTH_FAILED", what
    assert reply.retriable is False, what
    assert close_code == 1008, what


# -- scopes from claims -------------------------------------------------------------------------------------------


def test_users_see_and_write_only_their_own_records(stores: StoreFactory, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(await stores.open(), make_routes()) as server, http(server) as client:
            url = sync_url(server)
            alice = await sign_up(client, "alice@example.com")
            bob = await sign_up(client, "bob@example.com")
            alice_id, bob_id = alice["user"]["id"], bob["user"]["id"]
            # Alice's client even asks for Bob's scope: claims win, a client may only narrow its scope.
            a = app_for(tmp_path, "a", url, alice["accessToken"], scope={"userId": bob_id})
            b = app_for(tmp_path, "b", url, bob["accessToken"])
            try:
                own_a = [a.todos.insert({"ownerId": alice_id, "title": f"alice {i}"}) for i in range(3)]
                forged = a.todos.insert({"ownerId": bob_id, "title": "written by alice into bob's list"})
                own_b = [b.todos.insert({"ownerId": bob_id, "title": f"bob {i}"}) for i in range(3)]
                rejected: list[Any] = []
                a.events.on("sync:rejected", rejected.append)
                await b.sync.connect()
                await b.sync.wait_until_synced(TIMEOUT)
                await a.sync.connect()
                await wait_for(lambda: len(rejected) == 1, "the rejection of alice's write into bob's scope")
                assert rejected[0].code == "SCOPE_VIOLATION"
                assert rejected[0].operation.record_id == forged["id"]
                await a.sync.wait_until_synced(TIMEOUT)
                assert a.todos.find_by_id(forged["id"]) is None  # undone locally

                # Alice moving her own record into Bob's scope is refused as well.
                a.todos.update(own_a[0]["id"], {"ownerId": bob_id})
                await wait_for(lambda: len(rejected) == 2, "the rejection of moving a record to bob")
                assert a.todos.find_by_id(own_a[0]["id"]) == own_a[0]

                # A second device of each user catches up from the server alone: exactly its user's records.
                a2 = app_for(tmp_path, "a2", url, alice["accessToken"])
                b2 = app_for(tmp_path, "b2", url, bob["accessToken"])
                try:
                    await a2.sync.connect()
                    await b2.sync.connect()
                    await a2.sync.wait_until_synced(TIMEOUT)
                    await b2.sync.wait_until_synced(TIMEOUT)
                    mine_a = {r["id"] for r in own_a}
                    mine_b = {r["id"] for r in own_b}
                    await wait_for(
                        lambda: {r["id"] for r in a2.todos.all().fetch()} == mine_a, "alice's records"
                    )
                    await wait_for(
                        lambda: {r["id"] for r in b2.todos.all().fetch()} == mine_b, "bob's records"
                    )
                    # New writes flow live to the owner's other devices only.
                    late = b.todos.insert({"ownerId": bob_id, "title": "bob, later"})
                    await wait_for(lambda: b2.todos.find_by_id(late["id"]) is not None, "bob's live write")
                    marker = a.todos.insert({"ownerId": alice_id, "title": "alice marker"})
                    await wait_for(lambda: a2.todos.find_by_id(marker["id"]) is not None, "alice's marker")
                    await a.sync.wait_until_synced(TIMEOUT)
                    for app in (a, a2):
                        assert all(r["ownerId"] == alice_id for r in app.todos.all().fetch())
                        assert touched_records(app) <= mine_a | {marker["id"]}  # not one of bob's operations
                    for app in (b, b2):
                        assert all(r["ownerId"] == bob_id for r in app.todos.all().fetch())
                        assert forged["id"] not in touched_records(app)
                finally:
                    await close_all(a2, b2)
            finally:
                await close_all(a, b)

    asyncio.run(scenario())


# -- refusals at the handshake ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def hs512(claims: dict[str, Any]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", jwt.InsecureKeyLengthWarning
        )  # the point: the right secret, wrong alg
        return jwt.encode(claims, SECRET, algorithm="HS512")


def test_bad_tokens_are_refused_with_auth_failed(tmp_path: Path) -> None:
    clock = Clock()
    routes = AuthRoutes(secret=SECRET, password_hasher=FAST_HASHER, access_ttl=300, now=clock)

    async def scenario() -> None:
        async with serve(MemoryServerStore(), routes) as server, http(server) as client:
            url = sync_url(server)
            user = await sign_up(client, "mallory@example.com")
            good = user["accessToken"]
            reply, _ = await handshake(url, good)
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted
            assert reply.accepted_scope == {"todos": {"ownerId": user["user"]["id"]}}

            claims = jwt.decode(
                good, SECRET, algorithms=["HS256"], options={"verify_exp": False, "verify_iat": False}
            )
            refused = {
                "no token": None,
                "garbage": "not.a.token",
                "alg none": f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}.",
                "other secret": jwt.encode(claims, OTHER_SECRET, algorithm="HS256"),
                "HS512 with the right secret": hs512(claims),
                "forged user": jwt.encode({**claims, "sub": "someone-else"}, OTHER_SECRET, algorithm="HS256"),
            }
            for name, token in refused.items():
                reply, close_code = await handshake(url, token)
                assert_auth_failed(reply, close_code, name)

            clock.now += 300  # the access token expires
            assert_auth_failed(*await handshake(url, good))
            clock.now -= 300

            # Revoked: signing out ends the session, and its still unexpired access token with it.
            assert (
                await client.post("/auth/sign-out", json={"refreshToken": user["refreshToken"]})
            ).status_code == 204
            assert_auth_failed(*await handshake(url, good))

            # The client library reports it as a fatal AUTH_FAILED (it does not retry).
            app = app_for(tmp_path, "revoked", url, good)
            try:
                with pytest.raises(OfflineError) as caught:
                    await app.sync.connect()
                assert caught.value.code == "AUTH_FAILED"
                assert app.sync.status == "error"
            finally:
                await close_all(app)

    asyncio.run(scenario())


def test_a_store_failing_during_the_handshake_is_a_retriable_server_error(
    stores: StoreFactory, tmp_path: Path
) -> None:
    """The server's store fails while a handshake reads it (the sign-in's auth session, or the device's
    registration): the token is not known to be bad, so the client is told the server failed (INTERNAL_ERROR,
    retriable, close 1013: it tries again later) and not AUTH_FAILED (which stops it for good); sessions
    already connected, and the handshakes after the store recovers, are served."""
    from offline.core.errors import STORAGE_ERROR

    def failing(what: str) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise OfflineError(
                f"{stores.kind} store: {what} failed: OperationalError: disk I/O error", STORAGE_ERROR, {}
            )

        return fail

    async def scenario() -> None:
        store = await stores.open()
        async with serve(store, make_routes()) as server, http(server) as client:
            url = sync_url(server)
            alice = await sign_up(client, "alice@example.com")
            bob = await sign_up(client, "bob@example.com")
            connected = app_for(tmp_path, "bob", url, bob["accessToken"])
            try:
                await connected.sync.connect()
                await connected.sync.wait_until_synced(TIMEOUT)
                auth = store.auth_store()
                for target, name in ((auth, "reader"), (store, "node_principals")):
                    original = getattr(target, name)
                    setattr(target, name, failing(name))
                    try:
                        reply, close_code = await handshake(url, alice["accessToken"])
                    finally:
                        setattr(target, name, original)
                    assert isinstance(reply, p.ErrorMessage), (name, reply)
                    assert reply.code == p.INTERNAL_ERROR and reply.retriable, (name, reply)
                    assert "store" in reply.message and "try again" in reply.message, reply.message
                    assert close_code == 1013, name
                    # The session already connected goes on syncing.
                    connected.todos.insert({"ownerId": bob["user"]["id"], "title": f"while {name} failed"})
                    await connected.sync.wait_until_synced(TIMEOUT)
                reply, _ = await handshake(url, alice["accessToken"])
                assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply
            finally:
                await close_all(connected)

    asyncio.run(scenario())


# -- without a provider ---------------------------------------------------------------------------------------------


def test_server_without_provider_accepts_everyone_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        caplog.set_level(logging.WARNING, logger="offline.server")
        async with serve(MemoryServerStore(), make_routes(), guard_sync=False) as server:
            warnings = [
                r.getMessage() for r in caplog.records if "accepting all sync connections" in r.getMessage()
            ]
            assert len(warnings) == 1
            reply, _ = await handshake(sync_url(server), None)
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted
            reply, _ = await handshake(sync_url(server), "any-token-at-all")
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted
        caplog.clear()
        async with serve(MemoryServerStore(), make_routes(), guard_sync=True) as server:
            assert not [r for r in caplog.records if "accepting all sync connections" in r.getMessage()]
            assert_auth_failed(*await handshake(sync_url(server), None))

    asyncio.run(scenario())


# -- from the environment (AUTH_SECRET), in a server process ------------------------------------------------------

ENTRY = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"ownerId": t.string(), "title": t.string()}}},
        "sync": {"todos": {"where": {"ownerId": "userId"}}},
    }
)
"""


def test_auth_secret_in_the_environment_turns_auth_on(tmp_path: Path) -> None:
    entry = write_entry(tmp_path, ENTRY)
    with ServerProcess(entry, store="sqlite", env={"AUTH_SECRET": SECRET}) as process:

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=process.http_url, timeout=60) as client:
                user = await sign_up(client, "env@example.com")
            reply, _ = await handshake(process.sync_url, user["accessToken"])
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted
            assert reply.accepted_scope == {"todos": {"ownerId": user["user"]["id"]}}
            assert_auth_failed(*await handshake(process.sync_url, None))

        asyncio.run(scenario())
    log = process.log_path.read_text()
    assert "accepting all sync connections" not in log
    assert SECRET not in log
    # Without AUTH_SECRET the same server accepts everyone, and its log says so.
    with ServerProcess(entry, store="memory", log_path=tmp_path / "open.log") as process:
        reply, _ = asyncio.run(handshake(process.sync_url, None))
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted
    assert "accepting all sync connections" in (tmp_path / "open.log").read_text()
