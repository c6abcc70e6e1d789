"""Password reset by email, end to end, with a real SMTP server on loopback receiving the messages: the
emailed token works once, expires, is stored only as a hash; completion sets the password and revokes every
session (live sync sockets close); the request answers the same, without waiting for the store or the mail
server, whether or not the address has an account (and does the same work for both); limits."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_runtime.auth import AuthRoutes
from server_runtime.auth.audit import AuditQuery
from server_runtime.auth.password_reset import ACCEPTED_BODY
from server_runtime.auth.tokens import hash_secret
from server_runtime.email import SmtpEmailSender
from server_runtime.stores import MemoryServerStore
from tests.hardening.support import RawClient
from tests.support.smtp import smtp_server

from .conftest import (
    FAST_HASHER,
    PASSWORD,
    SECRET,
    StoreFactory,
    bearer,
    http,
    make_routes,
    serve,
    sign_up,
    sync_url,
)
from .email_support import APP, FROM, RESET, CountingTemplates, mail_routes, stored_token_values, token_in

NEW_PASSWORD = "a brand new passphrase"


async def request_reset(client: httpx.AsyncClient, email: str) -> httpx.Response:
    return await client.post("/auth/password-reset/request", json={"email": email})


async def complete(client: httpx.AsyncClient, token: str, password: str = NEW_PASSWORD) -> httpx.Response:
    return await client.post("/auth/password-reset/complete", json={"token": token, "password": password})


async def sign_in(client: httpx.AsyncClient, email: str, password: str) -> httpx.Response:
    return await client.post("/auth/sign-in", json={"email": email, "password": password})


def test_reset_end_to_end(stores: StoreFactory) -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            store = await stores.open()
            routes = mail_routes(mail)
            async with serve(store, routes) as server, http(server) as client:
                first = await sign_up(client, "ada@example.com")
                second = (await sign_in(client, "ada@example.com", PASSWORD)).json()
                held = RawClient(sync_url(server), token=first["accessToken"])
                await held.open()
                try:
                    answer = await request_reset(client, "Ada@Example.com ")
                    assert answer.status_code == 202 and answer.json() == ACCEPTED_BODY
                    message = await mail.next_to("ada@example.com", subject=RESET)
                    assert message.subject == "Reset your password"
                    token = token_in(message, "reset-password")
                    assert f'href="{APP}/reset-password?token=' in message.body("html")
                    # At rest: the hash only.
                    values = await stored_token_values(store.auth_store())
                    assert hash_secret(token) in values and token not in values

                    done = await complete(client, token)
                    assert done.status_code == 204, done.text
                    # Every session is over: refresh tokens, access tokens, and the live socket.
                    for pair in (first, second):
                        refreshed = await client.post(
                            "/auth/refresh", json={"refreshToken": pair["refreshToken"]}
                        )
                        assert refreshed.json()["error"]["code"] == "INVALID_REFRESH_TOKEN"
                        me = await client.get("/auth/me", headers=bearer(pair["accessToken"]))
                        assert me.status_code == 401
                    assert await held.wait_closed() == 1008
                    assert [(e.code, e.retriable) for e in held.errors] == [("SESSION_REVOKED", False)]
                finally:
                    await held.close()
                assert (await sign_in(client, "ada@example.com", PASSWORD)).status_code == 401
                signed_in = await sign_in(client, "ada@example.com", NEW_PASSWORD)
                assert signed_in.status_code == 200, signed_in.text
                # The message reached the address: it is verified now.
                me = await client.get("/auth/me", headers=bearer(signed_in.json()["accessToken"]))
                assert me.json()["emailVerified"] is True
                # Single use.
                again = await complete(client, token, "yet another passphrase")
                assert again.status_code == 400 and again.json()["error"]["code"] == "INVALID_RESET_TOKEN"
                assert await stored_token_values(store.auth_store()) == []
                # The audit log has the request, the reset and the refused reuse; never a token or password.
                await routes.mailer.idle()
                entries = await routes.audit.entries(AuditQuery(user=first["user"]["id"]))
                kinds = [e.kind for e in reversed(entries)]
                assert "password-reset-requested" in kinds and "password-reset" in kinds
                # The spent link names no account any more: the failure is logged without a subject.
                assert await routes.audit.entries(AuditQuery(kinds=("password-reset-failed",)))
                reset = next(e for e in entries if e.kind == "password-reset")
                assert reset.detail == {"sessionsRevoked": 2} and reset.actor == f"user:{first['user']['id']}"
                text = json.dumps([e.to_json() for e in await routes.audit.entries(AuditQuery(limit=1000))])
                for secret in (token, NEW_PASSWORD, PASSWORD, hash_secret(token)):
                    assert secret not in text

    asyncio.run(scenario())


def test_a_used_reset_voids_the_other_links_and_an_expired_link_fails() -> None:
    clock = [time.time()]

    async def scenario() -> None:
        async with smtp_server() as mail:
            routes = AuthRoutes(
                secret=SECRET,
                password_hasher=FAST_HASHER,
                email_sender=SmtpEmailSender(mail.url(), sender=FROM),
                app_url=APP,
                now=lambda: clock[0],
            )
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                await sign_up(client, "ada@example.com")
                for count in (1, 2):
                    assert (await request_reset(client, "ada@example.com")).status_code == 202
                    await mail.next_to("ada@example.com", count, RESET)
                older, newer = (token_in(m, "reset-password") for m in mail.to("ada@example.com", RESET))
                # 29 minutes on: still valid; using one voids the other.
                clock[0] += 29 * 60
                assert (await complete(client, newer)).status_code == 204
                voided = await complete(client, older, "another new passphrase")
                assert voided.json()["error"]["code"] == "INVALID_RESET_TOKEN"
                # A fresh link, 31 minutes later: expired.
                assert (await request_reset(client, "ada@example.com")).status_code == 202
                late = token_in(await mail.next_to("ada@example.com", 3, RESET), "reset-password")
                clock[0] += 31 * 60
                expired = await complete(client, late, "too late passphrase")
                assert expired.status_code == 400 and expired.json()["error"]["code"] == "INVALID_RESET_TOKEN"
                assert (await sign_in(client, "ada@example.com", NEW_PASSWORD)).status_code == 200

    asyncio.run(scenario())


def _answer(response: httpx.Response) -> tuple[int, Any, list[tuple[str, str]]]:
    headers = sorted((k, v) for k, v in response.headers.items() if k.lower() != "date")
    return response.status_code, response.json(), headers


def test_the_answer_is_the_same_for_unknown_addresses_and_waits_for_neither_store_nor_mail() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            templates = CountingTemplates()
            store = MemoryServerStore()
            routes = mail_routes(mail, email_templates=templates)
            async with serve(store, routes) as server, http(server) as client:
                await sign_up(client, "ada@example.com")
                await routes.mailer.idle()  # the sign-up's verification message
                mail.messages.clear()
                templates.rendered.clear()
                # The store's write lock held and the mail server stalled: both answers come anyway, so
                # neither can depend on what the store holds or on a delivery.
                mail.hold()
                async with store.auth_store().transaction():
                    known = await request_reset(client, "ada@example.com")
                    unknown = await request_reset(client, "nobody@example.com")
                assert _answer(known) == _answer(unknown)
                assert known.status_code == 202 and known.json() == ACCEPTED_BODY
                mail.release()
                await routes.mailer.idle()
                # The same work for both (the message is rendered for the unknown address too); only the
                # known address is stored and sent to.
                assert templates.rendered == {
                    ("password-reset", "ada@example.com"): 1,
                    ("password-reset", "nobody@example.com"): 1,
                }
                assert [m.recipients for m in mail.messages] == [["ada@example.com"]]

    asyncio.run(scenario())


def test_requests_and_completions_are_rate_limited_alike_for_every_address() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            limits = {"email_requests": 3, "email_requests_per_address": 7, "token_attempts": 3}
            routes = mail_routes(mail, rate_limits=limits)
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                await sign_up(client, "ada@example.com")
                # Per email address, known or not: the same 429 at the same count.
                for email in ("ada@example.com", "nobody@example.com"):
                    answers = [await request_reset(client, email) for _ in range(4)]
                    assert [a.status_code for a in answers] == [202, 202, 202, 429]
                    assert answers[3].json()["error"]["code"] == "RATE_LIMITED"
                    assert int(answers[3].headers["Retry-After"]) > 0
                # Per client address: the seventh accepted request is the last.
                assert (await request_reset(client, "carol@example.com")).status_code == 202
                assert (await request_reset(client, "dave@example.com")).status_code == 429
                # Completions: three bad tokens, then even a good one waits.
                # The account got its sign-up message and two resets: the third reset was dropped (per account).
                good = token_in(await mail.next_to("ada@example.com", 2, RESET), "reset-password")
                await routes.mailer.idle()
                assert len(mail.to("ada@example.com")) == 3
                for _ in range(3):
                    bad = await complete(client, "not-a-real-token")
                    assert bad.json()["error"]["code"] == "INVALID_RESET_TOKEN"
                refused = await complete(client, good)
                assert refused.status_code == 429
                # From another client address (a trusted proxy's X-Forwarded-For) the good token works.
                other = await client.post(
                    "/auth/password-reset/complete",
                    json={"token": good, "password": NEW_PASSWORD},
                    headers={"X-Forwarded-For": "203.0.113.9"},
                )
                assert other.status_code == 204, other.text

    asyncio.run(scenario())


def test_bad_input_and_a_server_without_email() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            routes = mail_routes(mail)
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                await sign_up(client, "ada@example.com")
                await request_reset(client, "ada@example.com")
                token = token_in(await mail.next_to("ada@example.com", 1, RESET), "reset-password")
                bad_email = await request_reset(client, "not an address")
                assert bad_email.json()["error"] == {
                    "code": "INVALID_INPUT",
                    "field": "email",
                    "message": bad_email.json()["error"]["message"],
                }
                short = await complete(client, token, "short")
                assert short.status_code == 400 and short.json()["error"]["field"] == "password"
                # A refused password does not spend the token.
                assert (await complete(client, token)).status_code == 204
        async with serve(MemoryServerStore(), make_routes()) as server, http(server) as client:
            answer = await request_reset(client, "ada@example.com")
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "EMAIL_NOT_CONFIGURED"

    asyncio.run(scenario())


def test_reset_tokens_live_in_every_store_kind_and_are_purged(stores: StoreFactory, tmp_path: Path) -> None:
    from server_runtime.auth.email_tokens import (
        PASSWORD_RESET,
        EmailTokenRow,
        insert_token,
        purge_tokens,
        take_token,
    )

    async def scenario() -> None:
        store = await stores.open()
        await store.set_schema(__import__("tests.auth.conftest", fromlist=["SCHEMA"]).SCHEMA)
        auth = store.auth_store()
        try:
            async with auth.transaction() as tx:
                await insert_token(tx, EmailTokenRow("h1", PASSWORD_RESET, "u1", "a@x.example", 1, 100))
                await insert_token(tx, EmailTokenRow("h2", PASSWORD_RESET, "u1", "a@x.example", 1, 10_000))
            async with auth.transaction() as tx:
                await purge_tokens(tx, 1_000)
            async with auth.transaction() as tx:
                assert await take_token(tx, "h1") is None
                taken = await take_token(tx, "h2")
                assert taken is not None and taken.user_id == "u1"
                assert await take_token(tx, "h2") is None
            with pytest.raises(RuntimeError):
                async with auth.reader() as tx:
                    await insert_token(tx, EmailTokenRow("h3", PASSWORD_RESET, "u1", "a@x.example", 1, 100))
        finally:
            await store.close()

    asyncio.run(scenario())


def test_deleting_a_user_deletes_its_emailed_tokens_and_verified_address(stores: StoreFactory) -> None:
    from server_runtime.auth.accounts import delete_user
    from server_runtime.auth.email_tokens import VERIFY_EMAIL, EmailTokenRow, insert_token, peek_token
    from server_runtime.auth.storage import User
    from server_runtime.auth.verified_emails import mark_verified, verified_email

    from .conftest import SCHEMA

    async def scenario() -> None:
        store = await stores.open()
        await store.set_schema(SCHEMA)
        auth = store.auth_store()
        try:
            async with auth.transaction() as tx:
                for user_id in ("u1", "u2"):
                    await tx.insert_user(User(user_id, f"{user_id}@x.example", None, 1))
                    await insert_token(
                        tx,
                        EmailTokenRow(
                            f"h-{user_id}", VERIFY_EMAIL, user_id, f"{user_id}@x.example", 1, 10**15
                        ),
                    )
                    await mark_verified(tx, user_id, f"{user_id}@x.example", 1)
            async with auth.transaction() as tx:
                assert await delete_user(tx, "u1")
            async with auth.reader() as tx:
                assert await peek_token(tx, "h-u1") is None and await verified_email(tx, "u1") is None
                assert (
                    await peek_token(tx, "h-u2") is not None
                    and await verified_email(tx, "u2") == "u2@x.example"
                )
        finally:
            await store.close()

    asyncio.run(scenario())
