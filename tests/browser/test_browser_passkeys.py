"""Passkeys in the browser client: the page's Web Worker (Pyodide) registers a passkey and signs in with it
through the Python auth client (`register_passkey`, `sign_in_with_passkey`), against a live server with
`create_auth_routes(passkeys=...)`.

A worker has no ``navigator.credentials``: the Python side asks the page (offline-client.js) to run each
WebAuthn ceremony and gets the credential back (see offline/worker.py). The authenticator is Chromium's
virtual one (DevTools protocol, ``WebAuthn.addVirtualAuthenticator``: CTAP2, internal, resident keys, user
verification). WebAuthn needs a secure context and an RP id matching the page, so the page is opened at
``http://localhost:<port>`` and the server's passkey settings name that origin. The usual loopback-only guard
(support.py) applies.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from pathlib import Path
from typing import Any

import pytest

from .support import copy_project, guarded_browser, load_module, new_context
from .test_browser_auth import AUTH_FUNCTIONS, PASSWORD, SCOPED_SCHEMA, auth_server, call, call_error
from .test_browser_client import eventually, open_app, sync_status

PASSKEY_FUNCTIONS = """

# -- added by tests/browser/test_browser_passkeys.py: passkeys from the page -------------------------------------
from offline.auth import is_passkey_supported as _is_passkey_supported


def passkeys_supported(app: App) -> bool:
    return _is_passkey_supported()


async def add_passkey(app: App) -> dict[str, Any]:
    return await _client().register_passkey()


async def sign_in_with_passkey(app: App) -> dict[str, Any]:
    await _client().sign_in_with_passkey()
    return await _sync_as(app, _client())


async def my_passkeys(app: App) -> list[dict[str, Any]]:
    return await _client().list_passkeys()


__all__ = [*__all__, "add_passkey", "my_passkeys", "passkeys_supported", "sign_in_with_passkey"]
"""

VIRTUAL_AUTHENTICATOR = {
    "protocol": "ctap2",
    "transport": "internal",
    "hasResidentKey": True,
    "hasUserVerification": True,
    "isUserVerified": True,
    "automaticPresenceSimulation": True,
}


@pytest.fixture(scope="module")
def passkey_project(web_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template with a per-user scope, the auth functions and the passkey functions, built."""
    from offline_cli.web_build import build_web_client

    variant = tmp_path_factory.mktemp("browser-passkeys") / "passkey-app"
    copy_project(web_project, variant)
    (variant / "schema.py").write_text(SCOPED_SCHEMA, encoding="utf-8")
    with (variant / "todos.py").open("a", encoding="utf-8") as todos:
        todos.write(AUTH_FUNCTIONS + PASSKEY_FUNCTIONS)
    build_web_client(variant, sync_url="/offline-sync")
    return variant


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def b64url(standard: str) -> str:
    """The DevTools protocol's base64 as WebAuthn's JSON form spells it (base64url, no padding)."""
    return base64.urlsafe_b64encode(base64.b64decode(standard)).rstrip(b"=").decode("ascii")


def test_the_worker_registers_a_passkey_and_signs_in_with_it(
    chromium: str, passkey_project: Path, tmp_path: Path
) -> None:
    schema = load_module(passkey_project / "schema.py", "passkey_app_schema").schema
    port = free_port()
    origin = f"http://localhost:{port}"  # a secure context whose host can be the RP id (an IP address cannot)
    passkeys = {"rp_id": "localhost", "rp_name": "Todo", "origins": [origin], "user_verification": "required"}

    async def scenario(live: Any) -> None:
        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            page = await open_app(context, origin)
            cdp = await context.new_cdp_session(page)
            await cdp.send("WebAuthn.enable", {"enableUI": False})
            added_authenticator = await cdp.send(
                "WebAuthn.addVirtualAuthenticator", {"options": VIRTUAL_AUTHENTICATOR}
            )
            authenticator = {"authenticatorId": added_authenticator["authenticatorId"]}

            # The worker's Python knows the page offers WebAuthn (a worker alone has no navigator.credentials).
            assert await call(page, "passkeys_supported") is True
            signed = await call(page, "sign_up", "ada@example.com", PASSWORD)
            assert signed["platform"] == "emscripten" and signed["sender"] == "FetchSender"
            ada_id = signed["user"]["id"]

            # Registration: the server's options go to the page, the authenticator makes a resident key.
            added = await call(page, "add_passkey")
            assert set(added) == {"credentialId", "createdAt"}, added
            stored = (await cdp.send("WebAuthn.getCredentials", authenticator))["credentials"]
            assert len(stored) == 1, stored
            assert b64url(stored[0]["credentialId"]) == added["credentialId"]
            assert stored[0]["rpId"] == "localhost" and stored[0]["isResidentCredential"] is True
            assert base64.b64decode(stored[0]["userHandle"]).decode("utf-8") == ada_id
            # The authenticator already holds it: the browser refuses a second one (excludeCredentials).
            again = await call_error(page, "add_passkey")
            assert again["code"] == "PASSKEY_EXISTS", again
            assert again["context"] == {"ceremony": "create", "reason": "InvalidStateError"}, again

            # Signed out, then in with the passkey alone: no email, no password.
            assert (await call(page, "sign_out"))["user"] is None
            signed_in = await call(page, "sign_in_with_passkey")
            assert signed_in["user"] == {"id": ada_id, "email": "ada@example.com"}
            assert signed_in["scope"] == {"userId": ada_id}  # the new session's token scopes the sync
            assert (await call(page, "whoami"))["email"] == "ada@example.com"
            stored = (await cdp.send("WebAuthn.getCredentials", authenticator))["credentials"]
            assert stored[0]["signCount"] >= 1  # the authenticator signed the server's challenge
            (listed,) = await call(page, "my_passkeys")
            assert listed["credentialId"] == added["credentialId"] and listed["lastUsedAt"]

            # The session works for sync like a password one.
            await sync_status(page, "connected", pending=0)
            await call(page, "add_mine", "signed in with a passkey")
            await sync_status(page, "connected", pending=0)

            async def on_the_server() -> None:
                owners = {r["title"]: r["ownerId"] for r in live.records("todos")}
                assert owners == {"signed in with a passkey": ada_id}

            await eventually(on_the_server)

    with auth_server(
        schema, passkey_project / "dist", tmp_path / "server.db", port=port, passkeys=passkeys
    ) as live:
        asyncio.run(scenario(live))
