"""The auth client against the real server: `create_production_server` with `create_auth_routes`, on loopback.

The access tokens live 2 seconds, so a test can watch one expire while the app stays connected. Nothing
sleeps and hopes: every wait polls a condition (usually the server's own verdict on a token) with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline import OfflineError, create_app, define_schema, t
from offline.auth import (
    AUTH_FAILED,
    EMAIL_TAKEN,
    INVALID_CREDENTIALS,
    RATE_LIMITED,
    AuthError,
    FileCredentialStore,
    OfflineAuth,
    create_offline_auth,
    create_offline_auth_sync,
    decode_claims,
)
from offline.store import App
from server_runtime import (
    ProductionServer,
    create_auth_routes,
    create_production_server,
    create_sqlite_server_store,
)

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"ownerId": t.string(), "title": t.string()}}},
        "sync": {"todos": {"where": {"ownerId": "userId"}}},
    }
)
SECRET = "live-test-secret-of-at-least-32-bytes!!"
PASSWORD = "correct horse battery"
ACCESS_TTL = 2
FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 2.0, "handshake_timeout": 10.0}
TIMEOUT = 30.0


class RecordingProvider:
    """The server's sync auth provider, noting every token a handshake presented (and the verdict)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[tuple[str | None, bool]] = []

    async def authenticate(self, token: str | None) -> dict[str, Any] | None:
        claims: dict[str, Any] | None = await self.inner.authenticate(token)
        self.seen.append((token, claims is not None))
        return claims

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Live:
    def __init__(self, server: ProductionServer, provider: RecordingProvider, folder: Path) -> None:
        self.server = server
        self.provider = provider
        self.folder = folder
        assert server.url is not None
        self.url = server.url
        self.sync_url = server.url.replace("http://", "ws://", 1) + "/offline-sync"
        self.apps: list[App] = []

    def auth(self, name: str) -> OfflineAuth:
        return create_offline_auth(
            server_url=self.url, credential_store=FileCredentialStore(self.folder / name)
        )

    def app(self, name: str, auth_client: Any) -> App:
        app = create_app(
            SCHEMA,
            sync={"url": self.sync_url, "auth_client": auth_client, **FAST},
            path=str(self.folder / name),
        )
        self.apps.append(app)
        return app

    async def accepted(self, token: str) -> bool:
        """The server's own verdict on an access token (not recorded)."""
        return await self.provider.inner.authenticate(token) is not None


@contextlib.asynccontextmanager
async def live_server(folder: Path, **route_options: Any) -> AsyncIterator[Live]:
    store = create_sqlite_server_store(str(folder / "server.db"))
    await store.set_schema(SCHEMA)
    routes = create_auth_routes(secret=SECRET, access_ttl=ACCESS_TTL, **route_options)
    provider = RecordingProvider(routes.to_sync_auth_provider())
    server = create_production_server(
        store=store, port=0, host="127.0.0.1", auth_routes=routes, sync_options={"auth": provider}
    )
    live: Live | None = None
    try:
        await server.start()
        live = Live(server, provider, folder)
        yield live
    finally:
        for app in live.apps if live is not None else []:
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()
        await server.stop()
        await store.close()  # or aiosqlite's worker threads keep the interpreter alive


async def wait_for(probe: Callable[[], Awaitable[bool]], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(0.05)


def test_reconnect_after_expiry_uses_a_refreshed_token_and_sign_out_revokes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with live_server(tmp_path) as live:
            auth = live.auth("creds.json")
            user = await auth.sign_up("ada@example.com", PASSWORD)
            bridge = create_offline_auth_sync(auth_client=auth, schema=SCHEMA)
            assert bridge.scope_values() == {"userId": user["id"]}
            app = live.app("app.db", bridge)

            await app.sync.connect()
            first = app.todos.insert({"ownerId": user["id"], "title": "before expiry"})
            await app.sync.wait_until_synced(TIMEOUT)
            first_token, accepted = live.provider.seen[-1]
            assert accepted and first_token is not None and decode_claims(first_token)["sub"] == user["id"]

            # The access token expires while the app is connected: the server ends that socket (TOKEN_EXPIRED)
            # and the client refreshes its token and reconnects on its own.
            await wait_for(lambda: _not(live.accepted(first_token)), "the first access token to expire")
            await wait_for(
                lambda: _reconnected(app, live, first_token), "the client to reconnect with a refreshed token"
            )

            # A reconnect after expiry: the handshake must carry a refreshed token, and sync works on.
            await app.sync.disconnect()
            await app.sync.connect()
            second_token, accepted = live.provider.seen[-1]
            assert accepted, "the server refused the reconnect's token"
            assert second_token is not None and second_token != first_token
            claims = decode_claims(second_token)
            assert claims["sub"] == user["id"] and claims["exp"] > decode_claims(first_token)["exp"]
            assert claims["sid"] == decode_claims(first_token)["sid"]  # the same session, refreshed
            app.todos.insert({"ownerId": user["id"], "title": "after the refresh"})
            await app.sync.wait_until_synced(TIMEOUT)

            # Another device of the same user sees both records through its claim-derived scope.
            phone = live.auth("phone.json")
            await phone.sign_in("ada@example.com", PASSWORD)
            other = live.app("phone.db", create_offline_auth_sync(auth_client=phone, schema=SCHEMA))
            await other.sync.connect()
            await other.sync.wait_until_synced(TIMEOUT)
            titles = sorted(r["title"] for r in other.todos.where({}).fetch())
            assert titles == ["after the refresh", "before expiry"]
            assert other.todos.find_by_id(first["id"]) is not None

            # Sign-out: credentials gone locally, the session revoked on the server.
            current = await auth.get_access_token()
            assert current is not None and await live.accepted(current)
            await app.sync.disconnect()
            assert await auth.sign_out() is True
            assert auth.user is None and not (tmp_path / "creds.json").exists()
            assert not await live.accepted(current)

            # A connection presenting the old token is refused with AUTH_FAILED.
            class Stale:
                async def get_access_token(self) -> str:
                    assert current is not None
                    return current

            stale = live.app("stale.db", Stale())
            with pytest.raises(OfflineError) as info:
                await stale.sync.connect()
            assert info.value.code == AUTH_FAILED
            assert live.provider.seen[-1] == (current, False)
            # And the signed-out client itself no longer gets in.
            with pytest.raises(OfflineError) as info:
                await app.sync.connect()
            assert info.value.code == AUTH_FAILED
            # The phone's session is a different one and still works.
            assert await phone.get_access_token() is not None and phone.user == user

    asyncio.run(scenario())


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def _reconnected(app: App, live: Any, old_token: str) -> bool:
    token, accepted = live.provider.seen[-1]
    return bool(accepted) and token != old_token and app.sync.status in ("connected", "syncing")


def test_contract_errors_and_refresh_reuse(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with live_server(tmp_path, rate_limits={"account_attempts": 2}) as live:
            auth = live.auth("creds.json")
            user = await auth.sign_up("grace@example.com", PASSWORD)
            assert (await auth.me())["id"] == user["id"]

            with pytest.raises(AuthError) as info:
                await live.auth("x.json").sign_up("grace@example.com", PASSWORD)
            assert info.value.code == EMAIL_TAKEN

            with pytest.raises(AuthError) as info:
                await live.auth("y.json").sign_in("grace@example.com", "wrong password!")
            assert info.value.code == INVALID_CREDENTIALS
            codes = []
            for _ in range(3):
                with pytest.raises(AuthError) as info:
                    # An unknown account is counted like a known one (a 429 reveals nothing either).
                    await live.auth("y.json").sign_in("nobody@example.com", "wrong password!")
                codes.append(info.value.code)
            assert codes == [INVALID_CREDENTIALS, INVALID_CREDENTIALS, RATE_LIMITED]
            assert info.value.context is not None and info.value.context["retry_after"] > 0

            # Someone replays our refresh token first: our refresh is the second use and ends the session.
            stored = auth.credential_store.load()
            assert stored is not None
            async with httpx.AsyncClient() as http:
                stolen = await http.post(
                    f"{live.url}/auth/refresh", json={"refreshToken": stored.refresh_token}
                )
            assert stolen.status_code == 200
            with pytest.raises(AuthError) as info:
                await auth.refresh()
            assert info.value.code == AUTH_FAILED
            assert info.value.context is not None and info.value.context["reason"] == "REFRESH_TOKEN_REUSED"
            assert auth.user is None and not (tmp_path / "creds.json").exists()
            # The whole family is revoked: the thief's fresh token is refused too.
            assert not await live.accepted(stolen.json()["accessToken"])

            # The same, discovered by a reconnect: the handshake's refresh ends the session, sync stops with
            # AUTH_FAILED instead of retrying for ever.
            laptop = live.auth("laptop.json")
            await laptop.sign_in("grace@example.com", PASSWORD)
            app = live.app("laptop.db", create_offline_auth_sync(auth_client=laptop, schema=SCHEMA))
            await app.sync.connect()
            token = await laptop.get_access_token()
            assert token is not None
            await app.sync.disconnect()
            stored = laptop.credential_store.load()
            assert stored is not None
            async with httpx.AsyncClient() as http:
                replay = await http.post(
                    f"{live.url}/auth/refresh", json={"refreshToken": stored.refresh_token}
                )
            assert replay.status_code == 200
            await wait_for(lambda: _not(live.accepted(token)), "the laptop's access token to expire")
            with pytest.raises(OfflineError) as failed:
                await app.sync.connect()
            assert failed.value.code == AUTH_FAILED
            assert laptop.user is None and not (tmp_path / "laptop.json").exists()

    asyncio.run(scenario())
