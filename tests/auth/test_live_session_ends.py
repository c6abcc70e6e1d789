"""Revocation and expiry reach live sync sockets, against real server processes: a session revoked any way
(``/auth/revoke``, ``revoke all``, sign-out, refresh-token reuse) is told ``SESSION_REVOKED`` and closed, and
receives nothing more; a token expiring mid-session is told ``TOKEN_EXPIRED``. On SQLite (one process) and
on two processes sharing PostgreSQL (revoked through one, the socket held by the other closes). The real
client refreshes and reconnects after an expiry, and stops (status, event) after a revocation."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from offline import create_app
from offline.auth import create_offline_auth, create_offline_auth_sync
from offline.sync import protocol as p
from tests.hardening.support import SCHEMA, RawClient, Writer
from tests.support.servers import ServerProcess

from .conftest import PASSWORD, StoreFactory, http, make_routes, serve, sign_up, sync_url
from .live import TIMEOUT, auth_server, client_from, sign_up_from, wait_for
from .part_two import claims_of

WAYS = ["revoke", "revoke-all", "sign-out", "refresh-reuse"]


@dataclass
class Servers:
    """Where clients connect (``first``) and where revocations are sent (``second``; the same process on
    SQLite, another process sharing the database on PostgreSQL)."""

    first: ServerProcess
    second: ServerProcess


@contextlib.contextmanager
def servers(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest | None = None, **env: str
) -> Iterator[Servers]:
    started: list[ServerProcess] = []
    try:
        if kind == "sqlite":
            started.append(auth_server(tmp_path / "server", env=env))
            yield Servers(started[0], started[0])
        else:
            assert request is not None, "PostgreSQL needs the test's request (for postgres_url)"
            url = request.getfixturevalue("postgres_url")
            for name in ("one", "two"):
                started.append(auth_server(tmp_path / name, store="postgres", db=url, env=env))
            yield Servers(started[0], started[1])
    finally:
        for process in started:
            assert process.terminate() == 0, process.log_path.read_text()


async def revoke(way: str, server: ServerProcess, session: dict[str, Any]) -> None:
    """End ``session`` (a token pair from sign-up or sign-in) the given way, through ``server``."""
    async with client_from(server) as client:
        bearer = {"Authorization": f"Bearer {session['accessToken']}"}
        if way == "revoke":
            response = await client.post("/auth/revoke", headers=bearer)
            assert response.status_code == 204, response.text
        elif way == "revoke-all":
            other = await client.post(
                "/auth/sign-in", json={"email": session["user"]["email"], "password": PASSWORD}
            )
            assert other.status_code == 200, other.text
            response = await client.post(
                "/auth/revoke",
                json={"all": True},
                headers={"Authorization": f"Bearer {other.json()['accessToken']}"},
            )
            assert response.status_code == 204, response.text
        elif way == "sign-out":
            response = await client.post("/auth/sign-out", json={"refreshToken": session["refreshToken"]})
            assert response.status_code == 204, response.text
        else:
            first = await client.post("/auth/refresh", json={"refreshToken": session["refreshToken"]})
            assert first.status_code == 200, first.text
            again = await client.post("/auth/refresh", json={"refreshToken": session["refreshToken"]})
            assert again.json()["error"]["code"] == "REFRESH_TOKEN_REUSED"


def board(writer: Writer, name: str) -> dict[str, Any]:
    return writer.op("boards", {"name": name})


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("way", WAYS)
def test_a_revoked_session_is_closed_and_receives_nothing_more(
    kind: str, way: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with servers(kind, tmp_path, request) as where:

        async def scenario() -> None:
            victim = await sign_up_from(where.first, "victim@example.com")
            other = await sign_up_from(where.first, "other@example.com")
            held = RawClient(where.first.sync_url, token=victim["accessToken"])
            peer = RawClient(where.first.sync_url, token=other["accessToken"])
            await held.open()
            await peer.open()
            try:
                # Live: its writes are acknowledged and it receives the others'.
                await held.push([board(held.writer, "before")])
                await peer.push([board(peer.writer, "seen")])
                await wait_for(
                    lambda: any(op["data"]["name"] == "seen" for op in held.received),
                    "the other user's write to arrive",
                )
                await revoke(way, where.second, victim)
                assert await held.wait_closed() == 1008
                assert [(e.code, e.retriable) for e in held.errors] == [("SESSION_REVOKED", False)]
                received = len(held.received)
                await peer.push([board(peer.writer, "after")])
                # The peer's session is untouched; a fresh client sees the write, the closed one never does.
                watcher = RawClient(where.first.sync_url, token=other["accessToken"])
                await watcher.open()
                await wait_for(lambda: len(watcher.received) == 3, "the write after the revocation")
                await watcher.close()
                assert len(held.received) == received
                assert peer.closed is None
                # The revoked token opens no new session either.
                again = RawClient(where.first.sync_url, token=victim["accessToken"])
                with pytest.raises(AssertionError, match="AUTH_FAILED"):
                    await again.open()
                await again.close()
            finally:
                await held.close()
                await peer.close()

        asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_token_expiring_mid_session_closes_it_with_token_expired(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # 5 s: long enough for the handshake to come first on a busy machine.
    with servers(kind, tmp_path, request, OFFLINE_AUTH_ACCESS_TTL="5") as where:

        async def scenario() -> None:
            user = await sign_up_from(where.first, "brief@example.com")
            held = RawClient(where.first.sync_url, token=user["accessToken"])
            await held.open()
            try:
                await held.push([board(held.writer, "while valid")])
                assert await held.wait_closed() == 1008
                assert [(e.code, e.retriable) for e in held.errors] == [("TOKEN_EXPIRED", True)]
            finally:
                await held.close()

        asyncio.run(scenario())


# -- the client --------------------------------------------------------------------------------------------------

FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 5.0, "handshake_timeout": 10.0}


async def signed_in_app(server: ServerProcess, folder: Path, email: str) -> tuple[Any, Any, list[str]]:
    """An app syncing with ``server`` through a real auth client signed in as ``email``; the reasons of its
    ``sync:disconnected`` events."""
    auth = create_offline_auth(server.http_url, credential_store=None, refresh_margin=1.0)
    try:
        await auth.sign_in(email, PASSWORD)
    except Exception:
        await auth.sign_up(email, PASSWORD)
    sync = {"url": server.sync_url, "auth_client": create_offline_auth_sync(auth, SCHEMA), **FAST}
    app = create_app(SCHEMA, sync=sync, path=str(folder / f"{email}.db"))
    reasons: list[str] = []
    app.events.on("sync:disconnected", lambda event: reasons.append(str(event.get("reason", ""))))
    await app.sync.connect()
    return app, auth, reasons


async def close_app(app: Any) -> None:
    with contextlib.suppress(Exception):
        await app.sync.disconnect()
    app.close()


def test_the_client_refreshes_and_reconnects_after_expiry_and_stops_after_revocation(tmp_path: Path) -> None:
    with servers("sqlite", tmp_path, OFFLINE_AUTH_ACCESS_TTL="3") as where:

        async def scenario() -> None:
            app, auth, reasons = await signed_in_app(where.first, tmp_path, "roaming@example.com")
            try:
                first = app.sync.connections
                await wait_for(lambda: any("TOKEN_EXPIRED" in r for r in reasons), "the token to expire")
                await wait_for(lambda: app.sync.connections > first, "the reconnect with a new token")
                app.boards.insert({"name": "after the refresh"})
                await app.sync.wait_until_synced(TIMEOUT)
                assert app.sync.status == "connected"
                # Signed out (the session is revoked): the client stops, says so, and does not come back. (Through
                # the refresh token: an access token living 3 s may expire on a busy machine before it arrives.)
                assert await auth.sign_out() is True
                await wait_for(lambda: app.sync.status == "error", "the client to stop syncing")
                assert app.sync.last_error is not None
                assert app.sync.last_error.code in ("SESSION_REVOKED", "TOKEN_EXPIRED", "AUTH_FAILED")
                assert "SESSION_REVOKED" in reasons or "AUTH_FAILED" in reasons
                connections = app.sync.connections
                await asyncio.sleep(1.0)
                assert app.sync.connections == connections
            finally:
                await close_app(app)

        asyncio.run(scenario())


def test_the_client_stops_on_session_revoked(tmp_path: Path) -> None:
    with servers("sqlite", tmp_path) as where:

        async def scenario() -> None:
            app, auth, reasons = await signed_in_app(where.first, tmp_path, "stopped@example.com")
            try:
                app.boards.insert({"name": "synced"})
                await app.sync.wait_until_synced(TIMEOUT)
                connections = app.sync.connections
                async with client_from(where.first) as client:
                    token = await auth.get_access_token()
                    response = await client.post("/auth/revoke", headers={"Authorization": f"Bearer {token}"})
                    assert response.status_code == 204
                await wait_for(lambda: app.sync.status == "error", "the client to stop syncing")
                assert app.sync.last_error is not None and app.sync.last_error.code == p.SESSION_REVOKED
                assert reasons[-1] == p.SESSION_REVOKED
                await asyncio.sleep(1.0)
                assert app.sync.connections == connections and app.sync.status == "error"
            finally:
                await close_app(app)

        asyncio.run(scenario())


# -- revocations written to the store by something else -------------------------------------------------------


def test_a_revocation_written_to_the_store_by_anything_else_closes_the_socket(stores: StoreFactory) -> None:
    """What another process, an admin tool or a script writes is found by the poll of live sessions."""

    async def scenario() -> None:
        store = await stores.open()
        async with serve(store, make_routes()) as server, http(server) as client:
            user = await sign_up(client, "polled@example.com")
            held = RawClient(sync_url(server), token=user["accessToken"])
            await held.open()
            try:
                session_id = claims_of(user["accessToken"])["sid"]
                async with store.auth_store().transaction() as tx:
                    assert await tx.revoke_session(session_id, int(time.time() * 1000), "by an admin")
                assert await held.wait_closed() == 1008
                assert [e.code for e in held.errors] == ["SESSION_REVOKED"]
            finally:
                await held.close()

    asyncio.run(scenario())
