"""Passkeys on a live server (SQLite store): a WebAuthn registration and a sign-in completed by a software
authenticator (EC P-256, attestation "none"), challenges kept server-side (single use, expiring), the origin
and the signature checked, and the configuration validated."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from offline.core.errors import OfflineError
from server_runtime import MemoryServerStore, create_sqlite_server_store
from server_runtime.auth.passkeys import passkey_config_from

from .conftest import bearer, http, sign_up
from .part_two import Clock, claims_of, error_code, post, routes_with, serve_with
from .soft_authenticator import SoftAuthenticator

ORIGIN = "http://localhost:5173"  # where the web app runs (the browser's origin, not the API server's)
PASSKEYS = {"rpId": "localhost", "rpName": "Acme Notes", "origins": [ORIGIN]}


def test_passkey_registration_and_sign_in(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="offline.server.auth")
    clock = Clock()
    authenticator = SoftAuthenticator(ORIGIN)

    async def scenario() -> None:
        store = create_sqlite_server_store(str(tmp_path / "server.db"))
        async with serve_with(store, routes_with(clock, passkeys=PASSKEYS)) as server, http(server) as client:
            ann = await sign_up(client, "ann@example.com")
            token = ann["accessToken"]

            assert error_code(await post(client, "/auth/passkeys/register/options", None)) == "AUTH_FAILED"
            started = await post(client, "/auth/passkeys/register/options", token)
            assert started.status_code == 200, started.text
            options: dict[str, Any] = started.json()["options"]
            assert options["rp"] == {"name": "Acme Notes", "id": "localhost"}
            assert options["user"]["name"] == "ann@example.com"
            assert options["authenticatorSelection"]["residentKey"] == "required"
            assert options["excludeCredentials"] == []
            credential = await authenticator.create(options)
            registered = await post(
                client,
                "/auth/passkeys/register/verify",
                token,
                {"challengeId": started.json()["challengeId"], "credential": credential},
            )
            assert registered.status_code == 201, registered.text
            assert registered.json()["credentialId"] == credential["id"]
            # The challenge was spent.
            replay = await post(
                client,
                "/auth/passkeys/register/verify",
                token,
                {"challengeId": started.json()["challengeId"], "credential": credential},
            )
            assert (replay.status_code, error_code(replay)) == (400, "PASSKEY_CHALLENGE_INVALID")
            again = (await post(client, "/auth/passkeys/register/options", token)).json()["options"]
            assert [c["id"] for c in again["excludeCredentials"]] == [credential["id"]]

            # Sign-in: no email, no password.
            asked = (await post(client, "/auth/passkeys/authenticate/options", None)).json()
            assert asked["options"]["rpId"] == "localhost" and not asked["options"].get("allowCredentials")
            assertion = await authenticator.get(asked["options"])
            signed_in = await post(
                client,
                "/auth/passkeys/authenticate/verify",
                None,
                {"challengeId": asked["challengeId"], "credential": assertion},
            )
            assert signed_in.status_code == 200, signed_in.text
            pair = signed_in.json()
            assert pair["user"] == ann["user"] and claims_of(pair["accessToken"])["sub"] == ann["user"]["id"]
            assert (await client.get("/auth/me", headers=bearer(pair["accessToken"]))).status_code == 200

            # The same assertion again: its challenge is spent; under a new challenge it does not match.
            used = await post(
                client,
                "/auth/passkeys/authenticate/verify",
                None,
                {"challengeId": asked["challengeId"], "credential": assertion},
            )
            assert error_code(used) == "PASSKEY_CHALLENGE_INVALID"
            fresh = (await post(client, "/auth/passkeys/authenticate/options", None)).json()
            stale = await post(
                client,
                "/auth/passkeys/authenticate/verify",
                None,
                {"challengeId": fresh["challengeId"], "credential": assertion},
            )
            assert (stale.status_code, error_code(stale)) == (401, "PASSKEY_FAILED")
            assert "challenge was not expected challenge" in caplog.records[-1].getMessage()

            # The right key on the wrong site (a look-alike origin the browser would allow for the RP id).
            phishing = SoftAuthenticator("http://login.localhost:5173", authenticator.credentials)
            fresh = (await post(client, "/auth/passkeys/authenticate/options", None)).json()
            elsewhere = await post(
                client,
                "/auth/passkeys/authenticate/verify",
                None,
                {"challengeId": fresh["challengeId"], "credential": await phishing.get(fresh["options"])},
            )
            assert error_code(elsewhere) == "PASSKEY_FAILED"
            assert "Unexpected client data origin" in caplog.records[-1].getMessage()

            # A challenge expires after five minutes.
            late = (await post(client, "/auth/passkeys/authenticate/options", None)).json()
            clock.advance(301)
            expired = await post(
                client,
                "/auth/passkeys/authenticate/verify",
                None,
                {"challengeId": late["challengeId"], "credential": await authenticator.get(late["options"])},
            )
            assert error_code(expired) == "PASSKEY_CHALLENGE_INVALID"
            bad_input = await post(client, "/auth/passkeys/authenticate/verify", None, {"challengeId": "x"})
            assert (bad_input.status_code, bad_input.json()["error"]["field"]) == (400, "credential")

            # Listing and removing; a removed passkey signs in no more.
            token = pair["accessToken"]
            listed = (await client.get("/auth/passkeys", headers=bearer(token))).json()["passkeys"]
            assert [p["credentialId"] for p in listed] == [credential["id"]] and listed[0]["lastUsedAt"]
            gone = await client.delete(f"/auth/passkeys/{credential['id']}", headers=bearer(token))
            assert gone.status_code == 204
            fresh = (await post(client, "/auth/passkeys/authenticate/options", None)).json()
            after = await post(
                client,
                "/auth/passkeys/authenticate/verify",
                None,
                {
                    "challengeId": fresh["challengeId"],
                    "credential": await authenticator.get(fresh["options"]),
                },
            )
            assert error_code(after) == "PASSKEY_FAILED"

    asyncio.run(scenario())


def test_passkeys_off_and_configuration_checks() -> None:
    async def scenario() -> None:
        async with serve_with(MemoryServerStore(), routes_with()) as server, http(server) as client:
            token = (await sign_up(client, "ann@example.com"))["accessToken"]
            off = await post(client, "/auth/passkeys/register/options", token)
            assert (off.status_code, error_code(off)) == (404, "PASSKEYS_NOT_CONFIGURED")

    asyncio.run(scenario())
    bad: list[dict[str, Any]] = [
        {"rp_id": "example.com", "origins": ["http://example.com"]},  # plain http off loopback
        {"rp_id": "example.com", "origins": ["https://example.org"]},  # not the RP id or a subdomain
        {"rp_id": "https://example.com", "origins": ["https://example.com"]},
        {"rp_id": "example.com", "origins": []},
        {"rp_id": "example.com", "origin": "https://example.com", "user_verification": "sometimes"},
    ]
    for config in bad:
        with pytest.raises(OfflineError) as caught:
            passkey_config_from(config)
        assert caught.value.code == "AUTH_CONFIG"
    good = passkey_config_from({"rp_id": "Example.com", "origin": "https://app.example.com/"})
    assert good is not None and (good.rp_id, good.origins, good.rp_name) == (
        "example.com",
        ("https://app.example.com",),
        "example.com",
    )
