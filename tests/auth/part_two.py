"""Shared pieces of the part-two auth tests (MFA, organizations, linking, passkeys, write rules): a clock the
test can move forward (TOTP codes belong to 30-second steps), and a live server with a schema and sync
options of the test's choosing."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pyotp

from offline.core.schema import SchemaDefinition
from server_runtime import create_production_server
from server_runtime.auth import AuthRoutes
from server_runtime.server import ProductionServer
from server_runtime.stores.base import ServerStore

from .conftest import FAST_HASHER, PASSWORD, SCHEMA, SECRET, bearer


class Clock:
    """Wall-clock time plus an offset the test advances (the server's only notion of "now")."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def next_step(self) -> None:
        """Move to the start of the next 30-second TOTP step (a new code)."""
        now = self()
        self.offset += 30 - now % 30 + 0.5


def routes_with(clock: Clock | None = None, **options: Any) -> AuthRoutes:
    options.setdefault("secret", SECRET)
    options.setdefault("password_hasher", FAST_HASHER)
    return AuthRoutes(now=clock, **options)


@contextlib.asynccontextmanager
async def serve_with(
    store: ServerStore,
    routes: AuthRoutes,
    *,
    schema: SchemaDefinition = SCHEMA,
    sync_options: dict[str, Any] | None = None,
) -> AsyncIterator[ProductionServer]:
    """A started server with ``routes`` at /auth and their provider on the sync endpoint; stopped and its
    store closed at the end."""
    await store.set_schema(schema)
    options = {"auth": routes.to_sync_auth_provider(), **(sync_options or {})}
    server = create_production_server(
        store=store, port=0, host="127.0.0.1", auth_routes=routes, sync_options=options
    )
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
        await store.close()


def claims_of(token: str) -> dict[str, Any]:
    decoded: dict[str, Any] = jwt.decode(
        token, SECRET, algorithms=["HS256"], options={"verify_exp": False, "verify_iat": False}
    )
    return decoded


def code_at(secret: str, clock: Clock) -> str:
    return pyotp.TOTP(secret).at(clock())


async def sign_in(client: httpx.AsyncClient, email: str, password: str = PASSWORD) -> httpx.Response:
    return await client.post("/auth/sign-in", json={"email": email, "password": password})


async def post(client: httpx.AsyncClient, path: str, token: str | None, body: Any = None) -> httpx.Response:
    headers = bearer(token) if token is not None else {}
    return await client.post(path, json=body if body is not None else {}, headers=headers)


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code
