"""Shared pieces of the auth tests: stores of each kind, a live server on loopback, a fast argon2 hasher.

Servers run in the test's own event loop (``asyncio.run``) on a free loopback port, with real HTTP and
WebSocket clients. Every server is stopped and its store closed when its block ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from offline import define_schema, t
from server_runtime import (
    MemoryServerStore,
    create_auth_routes,
    create_production_server,
    create_relational_server_store,
    create_sqlite_server_store,
)
from server_runtime.auth import AuthRoutes
from server_runtime.server import ProductionServer
from server_runtime.stores.base import ServerStore

SECRET = "test-auth-secret-d5e1c0ffee0123456789abcdef"  # >= 32 bytes
OTHER_SECRET = "another-secret-entirely-0123456789abcdefgh"
PASSWORD = "correct horse battery"
# Real argon2id, cheap parameters: the tests sign in many times.
FAST_HASHER = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)

# README-style schema: a todo belongs to the user whose id (the JWT `sub`) is in `ownerId`.
SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"ownerId": t.string(), "title": t.string()}}},
        "sync": {"todos": {"where": {"ownerId": "userId"}}},
    }
)


@dataclass
class StoreFactory:
    """Opens server stores of one kind on the same data (memory: a new, empty store each time)."""

    kind: str
    location: str | None
    opened: list[ServerStore] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return self.kind != "memory"

    async def open(self) -> ServerStore:
        store: ServerStore
        if self.kind == "memory":
            store = MemoryServerStore()
        elif self.kind == "sqlite":
            assert self.location is not None
            store = create_sqlite_server_store(self.location)
        else:
            assert self.location is not None
            store = await create_relational_server_store(self.location)
        self.opened.append(store)
        return store


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    kind = str(request.param)
    if kind == "postgres":
        return StoreFactory(kind, request.getfixturevalue("postgres_url"))
    return StoreFactory(kind, str(tmp_path / "server.db") if kind == "sqlite" else None)


def make_routes(**options: Any) -> AuthRoutes:
    options.setdefault("secret", SECRET)
    options.setdefault("password_hasher", FAST_HASHER)
    return create_auth_routes(**options)


@contextlib.asynccontextmanager
async def serve(
    store: ServerStore,
    routes: AuthRoutes | None,
    *,
    guard_sync: bool = True,
) -> AsyncIterator[ProductionServer]:
    """A started server with ``routes`` at /auth (and their provider on the sync endpoint when
    ``guard_sync``); stopped and its store closed at the end."""
    await store.set_schema(SCHEMA)
    sync_options = {"auth": routes.to_sync_auth_provider()} if routes is not None and guard_sync else None
    # The tests stand in for a proxy on loopback: their X-Forwarded-For names the client.
    server = create_production_server(
        store=store,
        port=0,
        host="127.0.0.1",
        auth_routes=routes,
        sync_options=sync_options,
        trusted_proxies="127.0.0.1",
    )
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
        await store.close()


def http(server: ProductionServer) -> httpx.AsyncClient:
    assert server.url is not None
    return httpx.AsyncClient(base_url=server.url, timeout=30.0)


def sync_url(server: ProductionServer) -> str:
    assert server.url is not None
    return server.url.replace("http://", "ws://") + server.sync_path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def sign_up(client: httpx.AsyncClient, email: str, password: str = PASSWORD) -> dict[str, Any]:
    response = await client.post("/auth/sign-up", json={"email": email, "password": password})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


class Capture(logging.Handler):
    """Every record logged under the given loggers, formatted (message with its arguments, and traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured_logs() -> Iterator[Capture]:
    """Everything the server side logs, down to DEBUG: the framework, uvicorn, and the HTTP client the
    server uses to reach OAuth providers (httpx, authlib)."""
    handler = Capture()
    loggers = [logging.getLogger(name) for name in ("offline", "uvicorn", "httpx", "authlib")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
