"""The auth client's password-reset and email-verification methods against a real server on loopback, with
the messages delivered to a real SMTP server there (aiosmtpd)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from offline import OfflineError, create_app
from offline.auth import (
    EMAIL_NOT_VERIFIED,
    INVALID_CREDENTIALS,
    INVALID_RESET_TOKEN,
    INVALID_VERIFICATION_TOKEN,
    AuthError,
    create_offline_auth,
    create_offline_auth_sync,
)
from server_runtime.stores import MemoryServerStore
from tests.auth.conftest import PASSWORD, SCHEMA, serve, sync_url
from tests.auth.email_support import RESET, VERIFY, mail_routes, token_in
from tests.auth.live import wait_for
from tests.support.smtp import smtp_server

NEW_PASSWORD = "a brand new passphrase"


def test_reset_password_through_the_client() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail, serve(MemoryServerStore(), mail_routes(mail)) as server:
            assert server.url is not None
            auth = create_offline_auth(server.url, credential_store=None)
            await auth.sign_up("ada@example.com", PASSWORD)
            await auth.request_password_reset("nobody@example.com")  # no error, no message
            await auth.request_password_reset("ada@example.com")
            token = token_in(await mail.next_to("ada@example.com", subject=RESET), "reset-password")
            await auth.reset_password(token, NEW_PASSWORD)
            with pytest.raises(AuthError) as caught:
                await auth.reset_password(token, "another passphrase")
            assert caught.value.code == INVALID_RESET_TOKEN
            with pytest.raises(AuthError) as caught:
                await auth.sign_in("ada@example.com", PASSWORD)
            assert caught.value.code == INVALID_CREDENTIALS
            user = await auth.sign_in("ada@example.com", NEW_PASSWORD)
            assert user["email"] == "ada@example.com"
            assert mail.to("nobody@example.com") == []

    asyncio.run(scenario())


def test_verify_email_through_the_client_refreshes_the_claim() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail, serve(MemoryServerStore(), mail_routes(mail)) as server:
            assert server.url is not None
            auth = create_offline_auth(server.url, credential_store=None)
            await auth.sign_up("ada@example.com", PASSWORD)
            assert auth.claims["email_verified"] is False
            assert await auth.request_email_verification() is False
            token = token_in(await mail.next_to("ada@example.com", 2, VERIFY), "verify-email")
            assert await auth.verify_email(token) == {"email": "ada@example.com", "emailVerified": True}
            assert auth.claims["email_verified"] is True
            assert (await auth.me())["emailVerified"] is True
            assert await auth.request_email_verification() is True
            with pytest.raises(AuthError) as caught:
                await auth.verify_email(token)
            assert caught.value.code == INVALID_VERIFICATION_TOKEN

    asyncio.run(scenario())


def test_sign_up_and_sign_in_say_when_the_server_requires_a_verified_address() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            routes = mail_routes(mail, require_verified_email=True)
            async with serve(MemoryServerStore(), routes) as server:
                assert server.url is not None
                auth = create_offline_auth(server.url, credential_store=None)
                with pytest.raises(AuthError) as caught:
                    await auth.sign_up("ada@example.com", PASSWORD)
                assert caught.value.code == EMAIL_NOT_VERIFIED
                assert caught.value.context["account_created"] is True
                assert not auth.is_signed_in
                with pytest.raises(AuthError) as caught:
                    await auth.sign_in("ada@example.com", PASSWORD)
                assert caught.value.code == EMAIL_NOT_VERIFIED
                token = token_in(await mail.next_to("ada@example.com", 2, VERIFY), "verify-email")
                await auth.verify_email(token)
                await auth.sign_in("ada@example.com", PASSWORD)
                assert auth.claims["email_verified"] is True

    asyncio.run(scenario())


def test_the_sync_client_stops_with_email_not_verified_and_syncs_once_verified(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            routes = mail_routes(mail, require_verified_email="sync")
            async with serve(MemoryServerStore(), routes) as server:
                assert server.url is not None
                auth = create_offline_auth(server.url, credential_store=None)
                await auth.sign_up("ada@example.com", PASSWORD)  # sign-in is not held back: only sync
                sync = {
                    "url": sync_url(server),
                    "auth_client": create_offline_auth_sync(auth, SCHEMA),
                    "backoff_initial": 0.05,
                    "backoff_max": 0.4,
                }
                app = create_app(SCHEMA, sync=sync, path=str(tmp_path / "ada.db"))
                try:
                    app.todos.insert({"ownerId": auth.user["id"], "title": "kept until verified"})
                    with contextlib.suppress(OfflineError):
                        await app.sync.connect()
                    await wait_for(lambda: app.sync.status == "error", "the client to stop syncing")
                    assert app.sync.last_error is not None and app.sync.last_error.code == EMAIL_NOT_VERIFIED
                    token = token_in(await mail.next_to("ada@example.com", subject=VERIFY), "verify-email")
                    await auth.verify_email(token)
                    await app.sync.connect()
                    await app.sync.wait_until_synced(30.0)
                    assert app.sync.status == "connected"
                finally:
                    with contextlib.suppress(Exception):
                        await app.sync.disconnect()
                    app.close()

    asyncio.run(scenario())
