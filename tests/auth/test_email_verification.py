"""Email verification end to end with a real SMTP server on loopback: the message at sign-up and on request,
the single-use token, ``email_verified`` in access tokens and ``/auth/me``, a changed address needing a new
verification, and ``require_verified_email`` refusing sign-in (in process) and sign-in or the sync handshake
of real server processes built from the environment (``OFFLINE_SMTP_URL``), whose logs never show the SMTP
password."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline.sync import protocol as p
from server_runtime.auth.audit import AuditQuery
from server_runtime.auth.storage import _MemoryTx, _SqlTx
from server_runtime.stores import MemoryServerStore
from tests.hardening.support import handshake_reply
from tests.support.smtp import smtp_server

from .conftest import PASSWORD, StoreFactory, bearer, http, serve, sign_up
from .email_support import APP, FROM, VERIFY, mail_routes, token_in
from .live import auth_server, client_from, wait_for
from .part_two import claims_of


async def verify(client: httpx.AsyncClient, token: str) -> httpx.Response:
    return await client.post("/auth/email/verify", json={"token": token})


async def me(client: httpx.AsyncClient, access: str) -> dict[str, Any]:
    answer = await client.get("/auth/me", headers=bearer(access))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_verification_end_to_end(stores: StoreFactory) -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            store = await stores.open()
            routes = mail_routes(mail)
            async with serve(store, routes) as server, http(server) as client:
                pair = await sign_up(client, "ada@example.com")
                assert claims_of(pair["accessToken"])["email_verified"] is False
                assert (await me(client, pair["accessToken"]))["emailVerified"] is False
                message = await mail.next_to("ada@example.com", subject=VERIFY)
                assert f'href="{APP}/verify-email?token=' in message.body("html")
                token = token_in(message, "verify-email")

                done = await verify(client, token)
                assert done.status_code == 200, done.text
                assert done.json() == {"email": "ada@example.com", "emailVerified": True}
                again = await verify(client, token)
                assert again.status_code == 400
                assert again.json()["error"]["code"] == "INVALID_VERIFICATION_TOKEN"
                # Read from the store at once; the token says so from the next refresh on.
                assert (await me(client, pair["accessToken"]))["emailVerified"] is True
                refreshed = await client.post("/auth/refresh", json={"refreshToken": pair["refreshToken"]})
                assert claims_of(refreshed.json()["accessToken"])["email_verified"] is True
                # Nothing left to verify: no message.
                asked = await client.post("/auth/email/verify/request", headers=bearer(pair["accessToken"]))
                assert asked.status_code == 200 and asked.json() == {"emailVerified": True}
                entries = await routes.audit.entries(AuditQuery(user=pair["user"]["id"]))
                kinds = {e.kind for e in entries}
                assert "email-verified" in kinds
                assert token not in json.dumps([e.to_json() for e in entries])

    asyncio.run(scenario())


def test_a_verification_message_on_request_within_the_accounts_limit() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            routes = mail_routes(mail, rate_limits={"email_requests": 3})
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                pair = await sign_up(client, "ada@example.com")  # message 1
                headers = bearer(pair["accessToken"])
                for count in (2, 3):
                    asked = await client.post("/auth/email/verify/request", headers=headers)
                    assert asked.status_code == 202 and asked.json() == {"emailVerified": False}
                    await mail.next_to("ada@example.com", count, VERIFY)
                limited = await client.post("/auth/email/verify/request", headers=headers)
                assert limited.status_code == 429 and "Retry-After" in limited.headers
                # Resets share the account's limit: this one is accepted (the answer never tells) but not sent.
                assert (
                    await client.post("/auth/password-reset/request", json={"email": "ada@example.com"})
                ).status_code == 202
                await routes.mailer.idle()
                assert len(mail.to("ada@example.com")) == 3
                # Any of the links works (the newest first here); then the others are void.
                tokens = [token_in(m, "verify-email") for m in mail.to("ada@example.com")]
                assert (await verify(client, tokens[-1])).status_code == 200
                assert (await verify(client, tokens[0])).status_code == 400
                assert (await client.post("/auth/email/verify/request")).status_code == 401

    asyncio.run(scenario())


async def _change_email(store: Any, user_id: str, email: str) -> None:
    """Change an account's address in the store (there is no route for it yet)."""
    from dataclasses import replace

    async with store.auth_store().transaction() as tx:
        if isinstance(tx, _MemoryTx):
            user = tx.d.users[user_id]
            tx._delete(tx.d.emails, user.email)
            tx._set(tx.d.emails, email, user_id)
            tx._set(tx.d.users, user_id, replace(user, email=email))
        else:
            assert isinstance(tx, _SqlTx)
            await tx.c.execute("UPDATE offline_auth_users SET email = ? WHERE id = ?", email, user_id)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_changed_address_is_unverified_until_the_new_one_is_proved(kind: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            store = await StoreFactory(kind, str(tmp_path / "server.db")).open()
            async with serve(store, mail_routes(mail)) as server, http(server) as client:
                pair = await sign_up(client, "ada@example.com")
                first = token_in(await mail.next_to("ada@example.com", subject=VERIFY), "verify-email")
                await client.post("/auth/email/verify/request", headers=bearer(pair["accessToken"]))
                second = token_in(await mail.next_to("ada@example.com", 2, VERIFY), "verify-email")
                assert (await verify(client, first)).status_code == 200
                await _change_email(store, pair["user"]["id"], "ada@new.example")
                assert (await me(client, pair["accessToken"]))["emailVerified"] is False
                # A link sent to the old address cannot verify the new one.
                assert (await verify(client, second)).status_code == 400
                asked = await client.post("/auth/email/verify/request", headers=bearer(pair["accessToken"]))
                assert asked.status_code == 202
                fresh = token_in(await mail.next_to("ada@new.example", subject=VERIFY), "verify-email")
                assert (await verify(client, fresh)).json() == {
                    "email": "ada@new.example",
                    "emailVerified": True,
                }
                assert (await me(client, pair["accessToken"]))["emailVerified"] is True

    asyncio.run(scenario())


def test_required_for_sign_in_creates_the_account_without_a_session_and_refuses_sign_in() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            routes = mail_routes(mail, require_verified_email="sign-in")
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                created = await client.post(
                    "/auth/sign-up", json={"email": "ada@example.com", "password": PASSWORD}
                )
                assert created.status_code == 201
                body = created.json()
                assert body["emailVerified"] is False and body["emailVerificationRequired"] is True
                assert "accessToken" not in body and "refreshToken" not in body
                await mail.next_to("ada@example.com", subject=VERIFY)
                wrong = await client.post(
                    "/auth/sign-in", json={"email": "ada@example.com", "password": "wrong pass"}
                )
                assert (
                    wrong.json()["error"]["code"] == "INVALID_CREDENTIALS"
                )  # told only with the right password
                refused = await client.post(
                    "/auth/sign-in", json={"email": "ada@example.com", "password": PASSWORD}
                )
                assert refused.status_code == 403 and refused.json()["error"]["code"] == "EMAIL_NOT_VERIFIED"
                # The refusal sent a fresh link.
                token = token_in(await mail.next_to("ada@example.com", 2, VERIFY), "verify-email")
                assert (await verify(client, token)).status_code == 200
                signed_in = await client.post(
                    "/auth/sign-in", json={"email": "ada@example.com", "password": PASSWORD}
                )
                assert signed_in.status_code == 200
                assert claims_of(signed_in.json()["accessToken"])["email_verified"] is True

    asyncio.run(scenario())


ISSUER = {"issuer": "https://id.example.com", "audience": "the-app", "jwksUrl": "https://id.example.com/jwks"}


def test_require_verified_email_needs_a_sender_and_a_known_value() -> None:
    from offline.core.errors import OfflineError

    from .conftest import make_routes

    for needs_a_sender in (
        {"require_verified_email": True},
        {
            "require_verified_email": "sync"
        },  # no external issuer: only this server's accounts, no way to verify
        {"require_verified_email": "sign-in", "external_issuers": [ISSUER]},  # sign-in is this server's
    ):
        with pytest.raises(OfflineError) as caught:
            make_routes(**needs_a_sender)
        assert caught.value.context["field"] == "email_sender"
        message = caught.value.message
        # What to set, in code and in the environment, and the one case that works without it.
        assert "email_sender" in message and "OFFLINE_SMTP_URL" in message and "OFFLINE_EMAIL_FROM" in message
        assert "external_issuers" in message and "OFFLINE_JWT_ISSUERS" in message
    assert make_routes(require_verified_email="sync", external_issuers=[ISSUER]) is not None
    with pytest.raises(OfflineError) as caught:
        make_routes(require_verified_email="always")
    assert caught.value.context["field"] == "require_verified_email"


# -- real server processes built from the environment -----------------------------------------------------------

SMTP_PASSWORD = "relay-Pa55word/with:odd@chars"


def _env(mail: Any, required: str) -> dict[str, str]:
    assert mail.cert is not None
    return {
        "OFFLINE_SMTP_URL": mail.url(),
        "OFFLINE_EMAIL_FROM": FROM,
        "OFFLINE_APP_URL": APP,
        "OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL": required,
        "SSL_CERT_FILE": str(mail.cert),  # the server process trusts the test's SMTP certificate
    }


def _assert_no_password(log: str) -> None:
    for form in (SMTP_PASSWORD, urllib.parse.quote(SMTP_PASSWORD, safe=""), "relay-Pa55word"):
        assert form not in log


def test_a_real_server_refuses_the_sync_handshake_until_the_address_is_verified(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with smtp_server(tls="starttls", user="mailer", password=SMTP_PASSWORD) as mail:
            server = auth_server(tmp_path / "server", env=_env(mail, "sync"))
            try:
                async with client_from(server) as client:
                    pair = await sign_up(client, "ada@example.com")
                    refused = await handshake_reply(server.sync_url, "node-ada-1", pair["accessToken"])
                    assert isinstance(refused, p.ErrorMessage)
                    assert (refused.code, refused.retriable) == ("EMAIL_NOT_VERIFIED", False)
                    message = await mail.next_to("ada@example.com", subject=VERIFY)
                    assert mail.logins == ["mailer"] and mail.tls_sessions >= 1
                    assert (await verify(client, token_in(message, "verify-email"))).status_code == 200
                    # The same access token: the handshake reads the store.
                    accepted = await handshake_reply(server.sync_url, "node-ada-1", pair["accessToken"])
                    assert isinstance(accepted, p.HandshakeResponse) and accepted.accepted
            finally:
                assert server.terminate() == 0
            _assert_no_password(server.log_path.read_text())

    asyncio.run(scenario())


def test_a_real_server_refuses_sign_in_until_the_address_is_verified_and_never_logs_the_smtp_password(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with smtp_server(tls="starttls", user="mailer", password=SMTP_PASSWORD) as mail:
            server = auth_server(tmp_path / "server", env=_env(mail, "true"))
            # A second server whose SMTP password is wrong: its delivery fails, and says so without it.
            broken_env = {**_env(mail, "false"), "OFFLINE_SMTP_URL": mail.url(password=SMTP_PASSWORD + "x")}
            broken = auth_server(tmp_path / "broken", env=broken_env)
            try:
                async with client_from(server) as client:
                    created = await client.post(
                        "/auth/sign-up", json={"email": "ada@example.com", "password": PASSWORD}
                    )
                    assert created.status_code == 201 and "accessToken" not in created.json()
                    refused = await client.post(
                        "/auth/sign-in", json={"email": "ada@example.com", "password": PASSWORD}
                    )
                    assert refused.json()["error"]["code"] == "EMAIL_NOT_VERIFIED"
                    message = await mail.next_to("ada@example.com", subject=VERIFY)
                    assert (await verify(client, token_in(message, "verify-email"))).status_code == 200
                    signed_in = await client.post(
                        "/auth/sign-in", json={"email": "ada@example.com", "password": PASSWORD}
                    )
                    assert signed_in.status_code == 200, signed_in.text
                    accepted = await handshake_reply(
                        server.sync_url, "node-ada-2", signed_in.json()["accessToken"]
                    )
                    assert isinstance(accepted, p.HandshakeResponse) and accepted.accepted
                async with client_from(broken) as client:
                    await sign_up(client, "bob@example.com")
                    asked = await client.post(
                        "/auth/password-reset/request", json={"email": "bob@example.com"}
                    )
                    assert asked.status_code == 202
                await wait_for(
                    lambda: "EMAIL_DELIVERY_FAILED" in broken.log_path.read_text(),
                    "the failed delivery's log line",
                )
                assert mail.to("bob@example.com") == []
            finally:
                assert server.terminate() == 0
                assert broken.terminate() == 0
            for process in (server, broken):
                _assert_no_password(process.log_path.read_text())

    asyncio.run(scenario())


def test_the_requirement_from_the_environment() -> None:
    from offline.core.errors import OfflineError
    from server_runtime.auth.settings import auth_options_from_environment

    name = "OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL"
    assert auth_options_from_environment({name: "true"})["require_verified_email"] is True
    assert auth_options_from_environment({name: "sync"})["require_verified_email"] == ["sync"]
    assert auth_options_from_environment({name: " Sign-In, sync "})["require_verified_email"] == [
        "sign-in",
        "sync",
    ]
    assert auth_options_from_environment({name: "0"})["require_verified_email"] is False
    assert "require_verified_email" not in auth_options_from_environment({})
    with pytest.raises(OfflineError) as caught:
        auth_options_from_environment({name: "always"})
    assert caught.value.context["field"] == name and "always" not in caught.value.message
