"""Auth against real server processes (`python -m server_runtime server.py` with `AUTH_SECRET`): the entry,
HTTP clients from chosen loopback source addresses (all of 127/8 is loopback), and answers' bookkeeping."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.hardening.support import SCHEMA_SOURCE
from tests.support.servers import ServerProcess, write_entry

from .conftest import PASSWORD, SECRET

# todos: each user's own (ownerId <- the token's subject); boards: shared by everyone. The protocol-level
# clients of tests.hardening.support speak this schema.
ENTRY = SCHEMA_SOURCE

TIMEOUT = 60.0


def auth_server(
    folder: Path, *, store: str = "sqlite", db: str | None = None, env: dict[str, str] | None = None
) -> ServerProcess:
    """A started server process with auth on (``AUTH_SECRET``) and ``env`` (e.g. ``OFFLINE_AUTH_*``)."""
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / "server.py"
    if not entry.exists():
        write_entry(folder, ENTRY)
    settings = {"AUTH_SECRET": SECRET, **(env or {})}
    log = folder / f"server-{len(list(folder.glob('server-*.log')))}.log"
    return ServerProcess(entry, store=store, db=db, env=settings, log_path=log).start()


def client_from(process: ServerProcess, address: str = "127.0.0.1") -> httpx.AsyncClient:
    """An HTTP client whose connections come from ``address`` (a loopback address other than 127.0.0.1
    stands for another machine)."""
    transport = httpx.AsyncHTTPTransport(local_address=address, limits=httpx.Limits(max_connections=200))
    return httpx.AsyncClient(base_url=process.http_url, transport=transport, timeout=TIMEOUT)


async def sign_up_from(process: ServerProcess, email: str, address: str = "127.0.0.1") -> dict[str, Any]:
    async with client_from(process, address) as client:
        response = await client.post("/auth/sign-up", json={"email": email, "password": PASSWORD})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def sign_in_from(
    process: ServerProcess, email: str, password: str = PASSWORD, address: str = "127.0.0.1"
) -> httpx.Response:
    async with client_from(process, address) as client:
        return await client.post("/auth/sign-in", json={"email": email, "password": password})


async def burst(
    process: ServerProcess, address: str, bodies: list[dict[str, Any]], path: str = "/auth/sign-in"
) -> list[httpx.Response]:
    """Send every body at once from ``address``."""
    async with client_from(process, address) as client:
        return list(await asyncio.gather(*(client.post(path, json=body) for body in bodies)))


def statuses(responses: list[httpx.Response]) -> Counter[int]:
    return Counter(r.status_code for r in responses)


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
